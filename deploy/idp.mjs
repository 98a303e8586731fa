// A stand-in identity provider for trying `auth:` with the compose stack: oauth2-mock-server (RS256
// keys, JWKS, OpenID discovery, a token endpoint) that gives ANY client ANY token it asks for. It
// is for a first look at identity and rules, never for real use: put your own issuer in
// deploy/servers.yaml (`auth.issuer`) and drop this service (docs/DEPLOY.md, "An identity provider").
//
//   node idp.mjs          (oauth2-mock-server installed beside it; compose.yaml's `idp` does both)
//
// Environment: IDP_PORT (default 8090; 0 picks a free one), IDP_ISSUER (default
// http://localhost:<port>, the `iss` of its tokens and the URL its documents name). Prints one JSON
// line once listening: {"issuer": "..."}.
//
// A token for the proxy, by the client credentials grant (the client's id is its subject):
//
//   curl -s http://localhost:8090/token -d grant_type=client_credentials -d client_id=ann \
//        -d scope=mcp -d resource=http://localhost:8080/mcp -d groups=finance,admins
//
// `resource` (RFC 8707) becomes the token's `aud`, `groups` (comma- or space-separated) its `groups`.
import { OAuth2Server } from "oauth2-mock-server";

const port = Number.parseInt(process.env.IDP_PORT ?? "8090", 10);
const server = new OAuth2Server();
await server.issuer.keys.generate("RS256");
if (process.env.IDP_ISSUER) server.issuer.url = process.env.IDP_ISSUER;

server.service.on("beforeTokenSigning", (token, req) => {
  const body = req.body ?? {};
  let client = body.client_id;
  const basic = req.headers.authorization ?? "";
  if (basic.startsWith("Basic ")) {
    client = decodeURIComponent(Buffer.from(basic.slice(6), "base64").toString().split(":")[0]);
  }
  if (body.grant_type === "client_credentials" && client) {
    token.payload.sub = client;
    token.payload.client_id = client;
  }
  if (body.resource) token.payload.aud = body.resource;
  if (typeof body.groups === "string") token.payload.groups = body.groups.split(/[\s,]+/).filter(Boolean);
});

await server.start(port, "0.0.0.0"); // the issuer, unless IDP_ISSUER named it: http://localhost:<port>
console.log(JSON.stringify({ issuer: server.issuer.url }));
process.once("SIGTERM", () => server.stop().then(() => process.exit(0)));
process.once("SIGINT", () => server.stop().then(() => process.exit(0)));
