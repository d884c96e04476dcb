// The e2b SDK side of `corral bench e2b`: create -> commands.run('true') ->
// kill, N times in a row (latency), then CONCURRENCY loops for DURATION_MS
// (cycles/s; 0 skips them). Prints one JSON object. Sandboxes carry the run's
// corral-bench label (LABEL) so the benchmark's sweep finds leftovers.
import { Sandbox } from 'e2b'

const n = Number(process.env.N || 30)
const conc = Number(process.env.CONCURRENCY || 4)
const durationMs = Number(process.env.DURATION_MS || 10000)
const template = process.env.E2B_TEMPLATE || 'busybox'
const metadata = { 'corral-bench': process.env.LABEL || 'e2b' }

async function cycle() {
  const sb = await Sandbox.create(template, { metadata, timeoutMs: 600_000 })
  try {
    const r = await sb.commands.run('true')
    if (r.exitCode !== 0) throw new Error('true exited ' + r.exitCode)
  } finally {
    await sb.kill()
  }
}

await cycle() // warm-up: connections, module load
const latencies = []
let errors = 0
let firstError
for (let i = 0; i < n; i++) {
  const t0 = performance.now()
  try {
    await cycle()
    latencies.push(performance.now() - t0)
  } catch (e) {
    errors++
    firstError ??= String(e)
  }
}
let cycles = 0
if (durationMs <= 0) {
  console.log(JSON.stringify({ latencies_ms: latencies, cycles, seconds: 0, errors, first_error: firstError }))
  process.exit(0)
}
// The rate is the sum of the workers' own rates (cycles over the time to
// the end of each one's last cycle), as the Go side's sustain: the workers
// stop one by one, and the wall time to the last one's end would charge
// each about half a cycle.
const start = performance.now()
const deadline = start + durationMs
let perS = 0
await Promise.all(Array.from({ length: conc }, async () => {
  let done = 0
  let busy = 0
  while (performance.now() < deadline) {
    try {
      await cycle()
      cycles++
      done++
    } catch (e) {
      errors++
      firstError ??= String(e)
    }
    busy = performance.now() - start
  }
  if (busy > 0) perS += done / (busy / 1000)
}))
const seconds = (performance.now() - start) / 1000
console.log(JSON.stringify({ latencies_ms: latencies, cycles, seconds, per_s: perS, errors, first_error: firstError }))
