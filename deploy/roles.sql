-- Least privilege for the Postgres store (docs/DEPLOY.md): run once, as the database's admin, in
-- the proxy's database. proxy_owner owns the schema and runs `mcp-spec-proxy store migrate`;
-- proxy_app is what the replicas connect as: it reads and writes the tables, creates nothing.
-- Set the passwords apart (\password proxy_owner), never in this file.
CREATE ROLE proxy_owner LOGIN;
CREATE ROLE proxy_app LOGIN;
CREATE SCHEMA proxy AUTHORIZATION proxy_owner;
GRANT USAGE ON SCHEMA proxy TO proxy_app;
-- Every table and sequence a migration creates later is the app's to use, without a new grant.
ALTER DEFAULT PRIVILEGES FOR ROLE proxy_owner IN SCHEMA proxy
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO proxy_app;
ALTER DEFAULT PRIVILEGES FOR ROLE proxy_owner IN SCHEMA proxy
    GRANT USAGE, SELECT ON SEQUENCES TO proxy_app;
ALTER ROLE proxy_owner SET search_path = proxy, public;
ALTER ROLE proxy_app SET search_path = proxy, public;
