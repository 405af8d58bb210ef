//! The tiny indenting XML writer every message is built with, and text escaping.

use std::fmt::Write as _;

use super::flights::Val;

/// Escapes text content and attribute values.
pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A tiny indenting XML writer; all text goes through [`escape`].
pub(super) struct Xml {
    pub(super) out: String,
    pub(super) depth: usize,
}

impl Xml {
    pub(super) fn new(prolog: bool) -> Self {
        let mut out = String::with_capacity(1024);
        if prolog {
            out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        }
        Self { out, depth: 0 }
    }

    fn indent(&mut self) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
    }

    pub(super) fn open(&mut self, tag: &str) {
        self.indent();
        let _ = writeln!(self.out, "<{tag}>");
        self.depth += 1;
    }

    pub(super) fn close(&mut self, tag: &str) {
        self.depth = self.depth.saturating_sub(1);
        self.indent();
        let _ = writeln!(self.out, "</{tag}>");
    }

    pub(super) fn text(&mut self, tag: &str, text: &str) {
        self.indent();
        let _ = writeln!(self.out, "<{tag}>{}</{tag}>", escape(text));
    }

    /// Writes text verbatim, unescaped: only for deliberately broken messages.
    pub(super) fn raw_line(&mut self, line: &str) {
        self.indent();
        self.out.push_str(line);
        self.out.push('\n');
    }

    pub(super) fn leaf(&mut self, tag: &str, val: &Val, short_empty: bool) {
        match val {
            Val::Text(t) => self.text(tag, t),
            Val::Empty if short_empty => self.raw_line(&format!("<{tag}/>")),
            Val::Empty => self.raw_line(&format!("<{tag}></{tag}>")),
            Val::Clear => self.text(tag, "-"),
            Val::Nil => self.raw_line(&format!(
                "<{tag} xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:nil=\"true\"/>"
            )),
        }
    }

    pub(super) fn finish(self) -> String {
        self.out
    }
}
