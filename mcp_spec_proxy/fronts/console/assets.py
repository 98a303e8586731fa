"""The console's two static files: its stylesheet and its script (plain JavaScript, no build step).

The script keeps the waiting list live from the server-sent events at `/events` (cards are
rendered by the server at `/pending/<id>`), and posts each decision as JSON to `/decide/<id>`
with the digest of the arguments the card showed; an edit goes as the edit box's text, which the
proxy parses (a browser's numbers would lose the digits of an integer past 2**53).
"""

CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d8dde6; --ok:#17663a; --no:#a61b1b; --bg:#f6f7f9; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--fg);
  background:var(--bg); }
header.top { display:flex; gap:1.5rem; align-items:center; padding:.6rem 1.2rem; background:#1d2330; color:#fff; }
header.top nav a { color:#cfd6e4; margin-right:1rem; text-decoration:none; }
header.top nav a[aria-current] { color:#fff; border-bottom:2px solid #fff; }
main { max-width:1100px; margin:0 auto; padding:1rem 1.2rem 4rem; }
.lead { color:var(--muted); max-width:60rem; }
.note { color:var(--muted); font-size:.9em; }
.empty { padding:2rem; text-align:center; color:var(--muted); border:2px dashed var(--line); border-radius:8px; }
article.call { background:#fff; border:1px solid var(--line); border-left:6px solid #d08a00; border-radius:8px;
  padding:1rem 1.2rem; margin:1rem 0; }
article.call.done { opacity:.7; border-left-color:#9aa4b5; }
#decided h2.decided { font-size:1rem; color:var(--muted); margin-top:2rem; border-top:1px solid var(--line);
  padding-top:.6rem; }
#decided article.call { padding:.4rem 1rem; margin:.4rem 0; }
#decided article.call h2 { font-size:1rem; cursor:pointer; }
#decided article.call:not(.open) > :not(h2):not(form.decide),
#decided article.call:not(.open) form.decide > :not(.status) { display:none; }
#decided article.call:not(.open) form.decide { margin:0; padding:0; border:0; }
article.call { overflow-wrap:anywhere; }  /* no unbroken text (a 3000-character key) pushes the values out of view */
article.call h2 { margin:.2rem 0; font-size:1.25rem; }
.meta { color:var(--muted); margin:.2rem 0 .8rem; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; vertical-align:top; padding:.35rem .5rem; border-bottom:1px solid var(--line); }
table.arguments th, table.fields th { width:14rem; }
.value, pre.value { white-space:pre-wrap; word-break:break-word; font-family:ui-monospace, monospace; font-size:.92em; }
pre.value { margin:.3rem 0; background:#f1f3f6; padding:.5rem; border-radius:4px; }
section { margin:.8rem 0; }
section.claim blockquote { margin:.3rem 0; padding:.4rem .8rem; border-left:4px solid #9aa4b5; background:#f1f3f6; }
section.model { background:#fff7e6; padding:.4rem .8rem; border-radius:4px; }
.observation { color:var(--muted); margin-left:1rem; }
section.overwrite pre { margin:.3rem 0; background:#f8f9fb; border:1px solid var(--line); border-radius:4px;
  padding:.4rem 0; font-family:ui-monospace, monospace; font-size:.9em; white-space:pre-wrap; overflow-wrap:anywhere; }
section.overwrite pre span { display:block; padding:0 .6rem; }
section.overwrite pre.numbered { padding:.4rem .6rem; }
section.overwrite pre.numbered span.number { display:inline; padding:0 .6rem 0 0; color:var(--muted); }
.diff .del, .counts .del { background:#fde7e7; color:#8a1414; }
.diff .add, .counts .add { background:#e3f5e8; color:#135c2e; }
.diff .hunk { color:var(--muted); background:#eef1f6; }
form.decide { margin-top:1rem; border-top:1px solid var(--line); padding-top:.8rem; }
form.decide .buttons { display:flex; gap:.6rem; }
button { font:inherit; padding:.45rem 1rem; border-radius:6px; border:1px solid #9aa4b5; background:#fff;
  cursor:pointer; }
button.approve { background:var(--ok); color:#fff; border-color:var(--ok); }
button.deny { background:var(--no); color:#fff; border-color:var(--no); }
label.reason { display:block; margin:.6rem 0; }
label.reason input { width:100%; padding:.35rem; font:inherit; }
details { margin:.5rem 0; }
details label { display:block; margin:.3rem 0; }
details.rule > p.rule-lead { margin:.5rem 0; }
.terms { margin:.4rem 0 .6rem; }
fieldset.term { border:0; border-top:1px solid var(--line); margin:0; padding:.45rem 0; display:grid;
  grid-template-columns:minmax(6rem, 12rem) 1fr; column-gap:1rem; row-gap:.25rem; }
fieldset.term legend { float:left; grid-row:span 2; font-weight:600; font-family:ui-monospace, monospace;
  overflow-wrap:anywhere; padding:0; }
fieldset.term .choice { grid-column:2; display:flex; gap:.4rem; align-items:baseline; margin:0; }
fieldset.term .choice input[type=radio] { width:auto; flex:none; }
fieldset.term .choice input[name=pattern] { flex:1; min-width:8rem; }
fieldset.term p.note { grid-column:2; margin:0; }
details.help { font-size:.9em; }
details input, textarea { width:100%; font-family:ui-monospace, monospace; padding:.35rem; }
.fields label.field { display:block; margin:.6rem 0; }
.fields .name { font-weight:600; font-family:ui-monospace, monospace; }
.fields .kind { color:var(--muted); font-size:.85em; }
.fields textarea { display:block; margin-top:.2rem; font:inherit; font-family:ui-monospace, monospace; }
details.json { margin-top:.8rem; }
.status { font-weight:600; }
.unseen { background:#ffe08a; color:#1d2330; border-radius:3px; padding:0 .2em; font-size:.8em; }
.status.error { color:var(--no); }
.status.ok { color:var(--ok); }
.lost { background:#fff1f0; border:2px solid var(--no); border-radius:8px; padding:.6rem 1rem; margin:1rem 0; }
.lost code.command { user-select:all; background:#fff; padding:0 .25em; overflow-wrap:anywhere; }
form.filters { display:flex; gap:.8rem; flex-wrap:wrap; align-items:end; margin:1rem 0; }
/* The reason is the one cell of prose: it keeps room to be read, and the short cells give way
   (a `.value` may break anywhere, so without a floor its column shrinks to one word). */
table.history td.reason { min-width:18rem; }
/* Names wrap at their separators (the page puts a <wbr> after each), never mid-word: a cell is at least
   as wide as the longest part of its name; only a part too long for any line is broken. */
table.history td code { overflow-wrap:break-word; word-break:normal; }
table.history td code.id { overflow-wrap:anywhere; }  /* a session id is no word: it gives the reason room */
table.history th, table.history td { padding:.35rem .3rem; }
.nowrap { white-space:nowrap; }
table.history tr.refused td.verdict { color:var(--no); font-weight:600; }
table.history tr.accepted td.verdict { color:var(--ok); font-weight:600; }
ol.story li { background:#fff; border:1px solid var(--line); border-radius:6px; padding:.4rem .8rem; margin:.6rem 0; }
svg.plot { width:100%; max-width:640px; background:#fff; border:1px solid var(--line); }
svg.plot .bar { fill:#4767a8; } svg.plot .axis { stroke:#5b6475; } svg.plot text { font-size:11px; fill:#1d2330; }
"""

JS = """
"use strict";
function post(card, body) {
  const status = card.querySelector(".status");
  status.className = "status"; status.textContent = "Sending…";
  body.digest = card.dataset.digest;
  return fetch("/decide/" + encodeURIComponent(card.dataset.id), {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    credentials: "same-origin",
  }).then(r => r.json().then(data => ({ok: r.ok, data: data}))).then(({ok, data}) => {
    status.className = ok ? "status ok" : "status error";
    status.textContent = ok ? data.message : (data.error || "refused");
    if (ok) settle(card, "");
  }).catch(err => { status.className = "status error"; status.textContent = "Could not reach the proxy: " + err; });
}
function parses(text) { try { JSON.parse(text); return true; } catch (err) { return false; } }
function decide(event) {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const card = button.closest("article.call");
  const action = button.dataset.action;
  const body = {action: action, reason: card.querySelector("input[name=reason]").value};
  if (action === "edit" || action === "edit-json") {
    // Sent as typed and parsed by the proxy: JSON.parse would round an integer past 2**53.
    body.action = "edit";
    const fields = [...card.querySelectorAll("label.field")];
    body.arguments = action === "edit-json" ? card.querySelector("textarea[name=arguments]").value
      : "{" + fields.map(f => {
          const text = f.querySelector("textarea").value;
          return f.dataset.key + ": " + (f.dataset.kind === "text" ? JSON.stringify(text) : text);
        }).join(", ") + "}";
    let wrong = null;  // the box whose JSON does not parse: said here, nothing sent
    if (action === "edit") {
      const bad = fields.find(f => f.dataset.kind === "json" && !parses(f.querySelector("textarea").value));
      if (bad) wrong = bad.querySelector(".name").textContent;
    } else if (!parses(body.arguments)) wrong = "the arguments";
    if (wrong !== null) {
      const status = card.querySelector(".status");
      status.className = "status error"; status.textContent = "Not valid JSON: " + wrong + ". Nothing was sent.";
      return;
    }
  }
  if (action === "rule") {
    // Per argument: null for "exactly this value" (the proxy compares it with the value it holds),
    // or the pattern typed; a value that no pattern may admit has no choice to make.
    body.patterns = {};
    card.querySelectorAll("fieldset.term").forEach(f => {
      const mode = f.querySelector("input[type=radio][value=pattern]");
      const input = f.querySelector("input[name=pattern]");
      body.patterns[JSON.parse(f.dataset.key)] = mode && input && mode.checked ? input.value : null;
    });
  }
  post(card, body);
}
function logins(servers) {
  // A remote server's login began or ended: its cards, rendered by the server, replace the old ones.
  const box = document.getElementById("logins");
  if (!box || !servers) return;
  const shown = [...box.querySelectorAll("article.login")].map(card => card.dataset.server).sort();
  if (JSON.stringify(shown) === JSON.stringify(servers)) return;
  fetch("/logins", {credentials: "same-origin"}).then(r => r.ok ? r.text() : "")
    .then(html => { box.innerHTML = html; });
}

function refresh(ids) {
  const list = document.getElementById("pending");
  const empty = document.getElementById("empty");
  if (!list) return;
  list.querySelectorAll("article.call").forEach(card => {
    if (!ids.includes(card.dataset.id) && !card.classList.contains("done")) {
      settle(card, "No longer waiting (decided elsewhere, timed out, or cancelled).");
    }
  });
  ids.forEach(id => {
    if (document.getElementById("call-" + id)) return;
    fetch("/pending/" + encodeURIComponent(id), {credentials: "same-origin"}).then(r => r.ok ? r.text() : "")
      .then(html => {
        if (html && !document.getElementById("call-" + id)) list.insertAdjacentHTML("beforeend", html);
      });
  });
  if (empty) empty.hidden = ids.length > 0;
}
function tick() {
  document.querySelectorAll("article.call:not(.done)").forEach(card => {
    const left = Math.max(0, Number(card.dataset.left) - 1);
    card.dataset.left = String(left);
    const span = card.querySelector(".left");
    if (span) span.textContent = String(Math.round(left));
  });
}
document.addEventListener("click", decide);
document.addEventListener("click", e => {  // a decided card opens and folds on its title
  const title = e.target.closest && e.target.closest("#decided article.call h2");
  if (title) title.closest("article.call").classList.toggle("open");
});
document.addEventListener("input", e => {  // typing a pattern chooses it over the exact value
  if (!e.target.matches || !e.target.matches("input[name=pattern]")) return;
  const mode = e.target.closest("fieldset.term").querySelector("input[type=radio][value=pattern]");
  if (mode) mode.checked = true;
});
document.addEventListener("submit", e => e.preventDefault());  // Enter in a field decides nothing
// The proxy gone (stopped, or restarted by its client) must show: the page never goes on saying
// that nothing waits. It then asks every few seconds: the same run back, or this tab's key accepted
// again (the new run's link opened in any tab), and it reloads; a new run's 403, and it says so.
function lost() {
  const banner = document.getElementById("lost");
  const empty = document.getElementById("empty");
  if (empty) empty.hidden = true;
  document.querySelectorAll("#pending article.call:not(.done)").forEach(card => {
    settle(card, "The proxy that held this call is gone: a call still waiting when it stops is never run.");
  });
  if (banner) banner.hidden = false;
  fetch("/alive", {credentials: "same-origin", cache: "no-store"}).then(r => {
    if (r.ok) { location.reload(); return; }
    say(r.status === 403 ? "replaced" : "stopped");
    setTimeout(lost, 2000);
  }).catch(() => { say("stopped"); setTimeout(lost, 2000); });
}
function say(why) {
  document.querySelectorAll("#lost p[data-why]").forEach(p => { p.hidden = p.dataset.why !== why; });
}
// A call no longer waiting leaves the waiting list for the decided one below it, folded to its
// title and outcome (a click on the title opens it): what still waits is always at the top.
function settle(card, text) {
  card.classList.add("done");
  card.querySelectorAll("button").forEach(b => b.disabled = true);
  const status = card.querySelector(".status");
  if (status && !status.textContent) status.textContent = text;
  const decided = document.getElementById("decided");
  if (!decided || card.parentElement === decided.querySelector(".list")) return;
  decided.querySelector(".list").prepend(card);
  decided.hidden = false;
}
if (document.getElementById("pending")) {
  const events = new EventSource("/events");
  events.addEventListener("queue", e => { const data = JSON.parse(e.data); refresh(data.ids); logins(data.logins); });
  events.addEventListener("error", () => { events.close(); lost(); });
  setInterval(tick, 1000);
}
"""
