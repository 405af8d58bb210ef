//! Well-formedness check and a shallow element tree of one message.
//!
//! The whole document is read with quick-xml's pull parser and checked for the well-formedness
//! rules quick-xml leaves to its caller (one root, nothing but whitespace, comments and
//! processing instructions outside it, every element closed, valid names, legal characters,
//! only the predefined entities and legal character references, no `]]>` in text, no `<` in
//! attribute values, no DTD). Elements are kept only down to [`MAX_STORED_DEPTH`] (the
//! deepest element the format reads is a flight field of a schedule,
//! `MSG/SCHD/FLIGHTS/FLIGHT/GATE`); deeper elements are checked and dropped, so neither memory
//! nor recursion depends on how deeply a (hostile or broken) message nests.

use quick_xml::events::attributes::Attribute;
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

/// Depth of the deepest element kept (the root is depth 1).
pub(super) const MAX_STORED_DEPTH: usize = 5;

/// The XML Schema instance namespace of `xsi:nil`.
const XSI_NS: &str = "http://www.w3.org/2001/XMLSchema-instance";

/// One element of the shallow tree.
#[derive(Debug, Clone, Default)]
pub(super) struct Node {
    /// The element name as written (prefix included).
    pub(super) name: String,
    /// The unescaped value of an `xsi:nil` attribute, if the element has one.
    pub(super) nil: Option<String>,
    /// The character data directly inside the element (text, references and CDATA sections,
    /// concatenated in document order, line ends normalised), untrimmed.
    pub(super) text: String,
    /// The stored child elements (none below [`MAX_STORED_DEPTH`]).
    pub(super) children: Vec<Node>,
    /// True when the element has at least one child element (stored or not).
    pub(super) has_child_elements: bool,
    /// The namespace prefixes the element declares (`xmlns:p="uri"`), for resolving the
    /// `xsi:nil` of its descendants.
    ns_decls: Vec<(String, String)>,
}

impl Node {
    /// The child elements named `name`, in document order.
    pub(super) fn children_named<'a, 'b>(
        &'a self,
        name: &'b str,
    ) -> impl Iterator<Item = &'a Node> + use<'a, 'b> {
        self.children.iter().filter(move |c| c.name == name)
    }
}

/// Parses `raw` into its root element, or says why it is not a well-formed document. One
/// leading byte-order mark is skipped (quick-xml would silently skip one more, so a second is
/// refused here: it is text before the root).
pub(super) fn parse(raw: &str) -> Result<Node, String> {
    let raw = check_characters(raw)?;
    let mut reader = strict_reader(raw);
    let mut b = Builder::default();
    loop {
        let event = match reader.read_event() {
            Ok(e) => e,
            Err(e) => {
                return Err(format!(
                    "not well-formed XML at byte {}: {e}",
                    reader.error_position()
                ))
            }
        };
        let at = reader.buffer_position();
        if let Event::Eof = event {
            return b.finish();
        }
        // Leading white space may precede the XML declaration (lenient: some senders write
        // a newline first); anything else may not.
        let leading_space = matches!(&event, Event::Text(t) if b.depth == 0 && t.iter().all(|c| c.is_ascii_whitespace()));
        b.event(event, at)?;
        b.seen_markup |= !leading_space;
    }
}

/// Skips one leading byte-order mark and refuses a second one or any character XML forbids
/// (quick-xml does not check characters).
fn check_characters(raw: &str) -> Result<&str, String> {
    let raw = raw.strip_prefix('\u{feff}').unwrap_or(raw);
    if raw.starts_with('\u{feff}') {
        return Err("text outside the root element: a second byte-order mark".into());
    }
    if let Some((at, c)) = raw.char_indices().find(|&(_, c)| !is_xml_char(c)) {
        return Err(format!(
            "illegal character U+{:04X} at byte {at}",
            u32::from(c)
        ));
    }
    Ok(raw)
}

/// A reader over `raw` with every check quick-xml offers turned on.
///
/// The plain reader, not quick-xml's NsReader: the latter counts nesting in a u16 and
/// overflows (a panic with overflow checks) past 65,535 levels. Namespaces matter only for
/// `xsi:nil` on the stored elements and are resolved over the stored ancestors instead.
fn strict_reader(raw: &str) -> Reader<&[u8]> {
    let mut reader = Reader::from_str(raw);
    let cfg = reader.config_mut();
    cfg.check_end_names = true;
    cfg.check_comments = true;
    cfg.allow_dangling_amp = false;
    cfg.allow_unmatched_ends = false;
    cfg.expand_empty_elements = false;
    cfg.trim_text(false);
    reader
}

/// Builds the shallow tree from the event stream.
#[derive(Default)]
struct Builder {
    /// The open elements down to [`MAX_STORED_DEPTH`].
    stack: Vec<Node>,
    /// How many elements are open (stored or not).
    depth: usize,
    /// The root, once closed.
    root: Option<Node>,
    /// True once anything but leading whitespace was read (an XML declaration must come first).
    seen_markup: bool,
}

impl Builder {
    /// Takes one event of the stream (all but `Eof`, which [`parse`] handles) ending before
    /// byte `at`, with the checks quick-xml leaves to its caller.
    fn event(&mut self, event: Event<'_>, at: u64) -> Result<(), String> {
        match event {
            Event::Start(e) => {
                let attrs = check_start(&e, at)?;
                self.open(element_name(&e, at)?, attrs, at)?;
            }
            Event::Empty(e) => {
                let attrs = check_start(&e, at)?;
                self.open(element_name(&e, at)?, attrs, at)?;
                self.close();
            }
            Event::End(_) => self.close(),
            Event::Text(t) => {
                let text = t
                    .xml10_content()
                    .map_err(|e| format!("undecodable text before byte {at}: {e}"))?;
                if text.contains("]]>") {
                    return Err(format!("`]]>` in text before byte {at}"));
                }
                self.text(&text, at)?;
            }
            Event::CData(t) => {
                if self.depth == 0 {
                    return Err(format!(
                        "CDATA section outside the root element at byte {at}"
                    ));
                }
                let text = t
                    .xml10_content()
                    .map_err(|e| format!("undecodable CDATA before byte {at}: {e}"))?;
                self.append(&text);
            }
            Event::GeneralRef(r) => {
                let name = r
                    .decode()
                    .map_err(|e| format!("undecodable reference before byte {at}: {e}"))?;
                self.reference(&name, at)?;
            }
            Event::Decl(_) => {
                if self.seen_markup {
                    return Err(format!(
                        "XML declaration not at the start of the message (byte {at})"
                    ));
                }
            }
            Event::DocType(_) => {
                return Err("DOCTYPE declarations are not accepted (the format has no DTD)".into())
            }
            Event::Comment(_) | Event::PI(_) | Event::Eof => {}
        }
        Ok(())
    }

    /// Appends the character an entity or character reference `&name;` stands for.
    fn reference(&mut self, name: &str, at: u64) -> Result<(), String> {
        let c = resolve_reference(name)
            .ok_or_else(|| format!("unknown or illegal reference `&{name};` before byte {at}"))?;
        if self.depth == 0 {
            return Err(format!("reference `&{name};` outside the root element"));
        }
        let mut buf = [0u8; 4];
        self.append(c.encode_utf8(&mut buf));
        Ok(())
    }

    fn open(&mut self, name: String, attrs: StartAttrs, at: u64) -> Result<(), String> {
        if self.depth == 0 && self.root.is_some() {
            return Err(format!("a second root element <{name}> at byte {at}"));
        }
        let parent_stored = self.depth == self.stack.len();
        if let Some(parent) = self.stack.last_mut().filter(|_| parent_stored) {
            parent.has_child_elements = true;
        }
        self.depth += 1;
        if self.depth <= MAX_STORED_DEPTH {
            let nil = self.resolve_nil(&attrs);
            self.stack.push(Node {
                name,
                nil,
                ns_decls: attrs.ns_decls,
                ..Node::default()
            });
        }
        Ok(())
    }

    /// The value of the element's `xsi:nil`: an attribute `p:nil` whose prefix `p` is bound
    /// to the XML Schema instance namespace on the element or a stored ancestor, or is the
    /// literal `xsi` and not bound at all (a sender that forgot the declaration).
    fn resolve_nil(&self, attrs: &StartAttrs) -> Option<String> {
        attrs
            .prefixed_nils
            .iter()
            .rev()
            .find(|(prefix, _)| {
                let bound = attrs
                    .ns_decls
                    .iter()
                    .rev()
                    .chain(
                        self.stack
                            .iter()
                            .rev()
                            .flat_map(|n| n.ns_decls.iter().rev()),
                    )
                    .find(|(p, _)| p == prefix);
                match bound {
                    Some((_, uri)) => uri == XSI_NS,
                    None => prefix == "xsi",
                }
            })
            .map(|(_, value)| value.clone())
    }

    fn close(&mut self) {
        // quick-xml has already checked that this end tag matches an open element.
        if self.depth <= MAX_STORED_DEPTH {
            if let Some(node) = self.stack.pop() {
                match self.stack.last_mut() {
                    Some(parent) => parent.children.push(node),
                    None => self.root = Some(node),
                }
            }
        }
        self.depth = self.depth.saturating_sub(1);
    }

    fn text(&mut self, text: &str, at: u64) -> Result<(), String> {
        if self.depth == 0 {
            if text.chars().any(|c| !is_xml_space(c)) {
                return Err(format!("text outside the root element before byte {at}"));
            }
            return Ok(());
        }
        self.append(text);
        Ok(())
    }

    /// Appends character data to the innermost stored element, if it is the open one.
    fn append(&mut self, text: &str) {
        if self.depth == self.stack.len() {
            if let Some(node) = self.stack.last_mut() {
                node.text.push_str(text);
            }
        }
    }

    fn finish(self) -> Result<Node, String> {
        if self.depth > 0 {
            let open = self
                .stack
                .last()
                .map(|n| n.name.as_str())
                .unwrap_or("an element");
            return Err(format!("truncated: <{open}> is never closed"));
        }
        self.root.ok_or_else(|| "no root element".to_string())
    }
}

/// The element name, checked against the XML `Name` production (ASCII strictly; any
/// non-ASCII letter is accepted).
fn element_name(e: &BytesStart<'_>, at: u64) -> Result<String, String> {
    let raw = e.name().into_inner();
    let name =
        std::str::from_utf8(raw).map_err(|_| format!("undecodable element name at byte {at}"))?;
    if !is_xml_name(name) {
        return Err(format!("invalid element name {name:?} at byte {at}"));
    }
    Ok(name.to_string())
}

/// What the attributes of a start tag say.
#[derive(Default)]
struct StartAttrs {
    /// Prefixed namespace declarations `xmlns:p="uri"` (prefix, uri).
    ns_decls: Vec<(String, String)>,
    /// Attributes `p:nil` (prefix, unescaped value).
    prefixed_nils: Vec<(String, String)>,
}

/// Checks the attributes of a start tag (names, quoting, duplicates, references, no `<`) and
/// collects the namespace declarations and `nil` attributes.
fn check_start(e: &BytesStart<'_>, at: u64) -> Result<StartAttrs, String> {
    let mut out = StartAttrs::default();
    for attr in e.attributes().with_checks(true) {
        let attr: Attribute<'_> =
            attr.map_err(|err| format!("bad attribute in a start tag before byte {at}: {err}"))?;
        let key = std::str::from_utf8(attr.key.into_inner())
            .map_err(|_| format!("undecodable attribute name before byte {at}"))?;
        if !is_xml_name(key) {
            return Err(format!("invalid attribute name {key:?} before byte {at}"));
        }
        let raw_value = std::str::from_utf8(&attr.value)
            .map_err(|_| format!("undecodable attribute value before byte {at}"))?;
        if raw_value.contains('<') {
            return Err(format!(
                "`<` in the value of attribute {key} before byte {at}"
            ));
        }
        let value = unescape(raw_value)
            .ok_or_else(|| format!("bad reference in attribute {key} before byte {at}"))?;
        if let Some((prefix, local)) = key.split_once(':') {
            if prefix == "xmlns" {
                out.ns_decls.push((local.to_string(), value));
            } else if local == "nil" {
                out.prefixed_nils.push((prefix.to_string(), value));
            }
        }
    }
    Ok(out)
}

/// Replaces the predefined entities and character references; `None` for an unknown entity,
/// an illegal character or a `&` without `;`.
fn unescape(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(rest.get(..amp)?);
        let after = rest.get(amp + 1..)?;
        let semi = after.find(';')?;
        out.push(resolve_reference(after.get(..semi)?)?);
        rest = after.get(semi + 1..)?;
    }
    out.push_str(rest);
    Some(out)
}

/// Resolves the name of a reference (between `&` and `;`): a predefined entity or a character
/// reference to a legal XML character.
fn resolve_reference(name: &str) -> Option<char> {
    let c = match name {
        "lt" => '<',
        "gt" => '>',
        "amp" => '&',
        "apos" => '\'',
        "quot" => '"',
        _ => {
            let num = name.strip_prefix('#')?;
            let code = match num.strip_prefix('x') {
                Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    u32::from_str_radix(hex, 16).ok()?
                }
                Some(_) => return None,
                None if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) => {
                    num.parse::<u32>().ok()?
                }
                None => return None,
            };
            char::from_u32(code)?
        }
    };
    is_xml_char(c).then_some(c)
}

/// The XML 1.0 `Char` production.
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// XML white space (`S`).
pub(super) fn is_xml_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// The XML `Name` production, strict for ASCII, lenient for other characters.
fn is_xml_name(name: &str) -> bool {
    let mut chars = name.chars();
    let start_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':' || !c.is_ascii();
    match chars.next() {
        Some(c) if start_ok(c) => {
            chars.all(|c| start_ok(c) || c.is_ascii_digit() || c == '-' || c == '.')
        }
        _ => false,
    }
}
