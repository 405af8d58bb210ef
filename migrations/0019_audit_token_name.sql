-- Accountable admin (issue 42 item 4): the name of the HTTP bearer token that ran an audited
-- action (`http.*_tokens` entries are `name:secret`; a bare token of earlier versions is named
-- `<scope>-<n>`), beside the actor the request body states. NULL for actions run from the
-- command line (whoever runs `msgexchange` on the host) and for rows written before this
-- migration.
ALTER TABLE audit_log ADD COLUMN token_name TEXT;
