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
// start (the connections opened) to the last answer and "cpu" this process's own CPU seconds meanwhile; the
// process exits at the last answer, not at autocannon's next 1 s tick.
'use strict'

const fs = require('fs')
const path = require('path')

const order = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
const autocannon = require(path.join(order.autocannon, 'node_modules', 'autocannon'))

let good = 0
let bad = 0
let non2xx = 0
let errors = 0
let last = 0n
const latencies = []
function answered (body) {
  last = process.hrtime.bigint()
  const ok = carries(body)
  if (ok) good++
  else bad++
  // The last answer ends the level: autocannon itself would wait for its next 1 s tick, which the caller's
  // measure of the target and the machine would count as the level's.
  if (good + bad === order.amount) setImmediate(report)
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

function report () {
  const cpu = process.cpuUsage(cpuStart)
  latencies.sort((a, b) => a - b)
  const at = (q) => latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * q))] : null
  console.log(JSON.stringify({
    reads: good,
    bad,
    errors,
    non2xx,
    seconds: Number(last - started) / 1e9,
    cpu: (cpu.user + cpu.system) / 1e6,
    p50_ms: at(0.5),
    p99_ms: at(0.99)
  }))
  process.exit(0)
}

const cpuStart = process.cpuUsage()
const started = process.hrtime.bigint()
const instance = autocannon({
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
}, (error) => { // only where the answers fell short of the amount: the last answer reports and exits first
  if (error) {
    console.log(JSON.stringify({ error: String(error) }))
    process.exit(1)
  }
  report()
})
// Each answer's status and latency come before its body is checked; errors and timeouts are never answers.
instance.on('response', (client, statusCode, bytes, ms) => {
  if (statusCode < 200 || statusCode > 299) non2xx++
  latencies.push(ms)
})
instance.on('reqError', () => { errors++ })
