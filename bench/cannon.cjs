// One throughput level of bench/front_load.py driven by npm autocannon instead of SDK clients.
//
//     node bench/cannon.cjs ORDER.json      (started by front_load --driver autocannon; not run by hand)
//
// ORDER: {"autocannon": its folder, "url", "headers", "body" (a tools/call whose id is "[<id>]"),
//         "sessions": handshake-era session ids, one a connection, or null (2026-07-28: none),
//         "connections", "amount": reads in all}
// Prints one JSON line: {"reads", "bad", "errors", "non2xx", "seconds", "cpu", "p50_ms", "p99_ms"}, where
// "reads" are the answers that carried a finished tools/call result (content, no isError, no resultType but
// "complete"; a JSON body or the last event of an SSE body), "bad" the others, "seconds" the wall time from the
// start (the connections opened) to the last answer and "cpu" this process's own CPU seconds meanwhile (and until
// autocannon's next 1 s tick).
'use strict'

const fs = require('fs')
const path = require('path')

const order = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
const autocannon = require(path.join(order.autocannon, 'node_modules', 'autocannon'))

let good = 0
let bad = 0
let last = 0n
function answered (body) {
  last = process.hrtime.bigint()
  const ok = carries(body)
  if (ok) good++
  else bad++
  return ok
}

function carries (body) {
  let text = body.trimStart()
  if (!text.startsWith('{')) text = lastEventData(text) // an SSE body: the answer is its last event
  try {
    const result = JSON.parse(text).result
    // a finished tools/call result: content, not an error, not a request for input (2026-07-28's input_required)
    return Boolean(result) && Array.isArray(result.content) && result.isError !== true &&
      (result.resultType === undefined || result.resultType === 'complete')
  } catch (error) {
    return false
  }
}

// The data of an SSE body's last event that has any: its data lines joined by newlines, as EventSource joins them.
function lastEventData (text) {
  let data = ''
  for (const event of text.split(/\r?\n\r?\n/)) {
    const lines = event.split(/\r?\n/).filter((line) => line.startsWith('data:'))
    if (lines.length > 0) data = lines.map((line) => line.slice(line.startsWith('data: ') ? 6 : 5)).join('\n')
  }
  return data
}

let next = 0
function setupClient (client) {
  if (order.sessions) {
    const headers = Object.assign({}, order.headers, { 'mcp-session-id': order.sessions[next++ % order.sessions.length] })
    client.setHeaders(headers)
  }
}

const cpuStart = process.cpuUsage()
const started = process.hrtime.bigint()
autocannon({
  url: order.url,
  method: 'POST',
  headers: order.headers,
  body: order.body,
  idReplacement: true,
  connections: order.connections,
  amount: order.amount,
  timeout: 60,
  setupClient,
  verifyBody: answered
}, (error, result) => {
  if (error) {
    console.log(JSON.stringify({ error: String(error) }))
    process.exit(1)
  }
  const cpu = process.cpuUsage(cpuStart)
  const seconds = Number(last - started) / 1e9 // autocannon's own start and finish fall on its 1 s ticks
  console.log(JSON.stringify({
    reads: good,
    bad,
    errors: result.errors,
    non2xx: result.non2xx,
    seconds,
    cpu: (cpu.user + cpu.system) / 1e6,
    p50_ms: result.latency.p50,
    p99_ms: result.latency.p99
  }))
})
