// Drives corral's E2B API with the unchanged e2b SDK. Run by
// internal/e2b's Go test (TestE2BSDK), which starts the server and sets
// E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Each case prints one JSON
// line {"case", "ok", "error"}; CASES (comma-separated) selects cases.
import http from 'node:http'
import crypto from 'node:crypto'
import {
  Sandbox,
  CommandExitError,
  TimeoutError,
  NotFoundError,
  FileNotFoundError,
  AuthenticationError,
} from 'e2b'

const template = process.env.E2B_TEMPLATE || 'busybox'
const runId = crypto.randomBytes(4).toString('hex')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function assert(cond, msg) {
  if (!cond) throw new Error('assertion failed: ' + msg)
}
function eq(got, want, what) {
  const g = JSON.stringify(got)
  const w = JSON.stringify(want)
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`)
}
async function rejects(p, cls, what) {
  try {
    await p
  } catch (e) {
    if (!(e instanceof cls)) throw new Error(`${what}: got ${e?.constructor?.name}: ${e?.message}, want ${cls.name}`)
    return e
  }
  throw new Error(`${what}: did not fail, want ${cls.name}`)
}
async function until(what, fn, ms = 10000) {
  const end = Date.now() + ms
  for (;;) {
    if (await fn()) return
    if (Date.now() > end) throw new Error('timed out waiting for ' + what)
    await sleep(100)
  }
}

let sb // the sandbox most cases share
const cases = {
  async create() {
    sb = await Sandbox.create(template, { timeoutMs: 600_000, metadata: { suite: runId, role: 'main' }, envs: { SANDBOX_VAR: 'from-create' } })
    assert(sb.sandboxId, 'sandbox id')
  },

  async run_output() {
    const r = await sb.commands.run('echo out; echo err >&2')
    eq([r.exitCode, r.stdout, r.stderr], [0, 'out\n', 'err\n'], 'result')
  },

  async run_nonzero_exit() {
    const e = await rejects(sb.commands.run('echo partial; exit 7'), CommandExitError, 'exit 7')
    eq([e.exitCode, e.stdout], [7, 'partial\n'], 'exit error')
  },

  async run_env_cwd() {
    const r = await sb.commands.run('echo $FOO $SANDBOX_VAR; pwd', { envs: { FOO: 'bar' }, cwd: '/tmp' })
    eq(r.stdout, 'bar from-create\n/tmp\n', 'stdout')
    eq((await sb.commands.run('pwd', { cwd: 'tmp' })).stdout, '/tmp\n', 'relative cwd')
  },

  async run_streams() {
    const seen = []
    const r = await sb.commands.run('echo one; sleep 0.3; echo two >&2', {
      onStdout: (d) => seen.push('out:' + d),
      onStderr: (d) => seen.push('err:' + d),
    })
    eq(seen, ['out:one\n', 'err:two\n'], 'callbacks')
    eq(r.stdout, 'one\n', 'stdout')
  },

  async run_timeout() {
    await rejects(sb.commands.run('sleep 30', { timeoutMs: 700 }), TimeoutError, 'timeoutMs')
    await until('the timed out command to be killed', async () => !(await sb.commands.list()).some((p) => p.args.join(' ').includes('sleep 30')))
  },

  async background_list_kill() {
    const h = await sb.commands.run('sleep 120', { background: true })
    const list = await sb.commands.list()
    const p = list.find((x) => x.pid === h.pid)
    assert(p, `pid ${h.pid} in commands.list ${JSON.stringify(list)}`)
    eq(p.args.slice(-1), ['sleep 120'], 'listed args')
    eq(await sb.commands.kill(h.pid), true, 'kill')
    await rejects(h.wait(), CommandExitError, 'wait after kill')
    assert(!(await sb.commands.list()).some((x) => x.pid === h.pid), 'gone from list')
    eq(await sb.commands.kill(h.pid), false, 'kill of a gone pid')
  },

  async background_connect() {
    const h = await sb.commands.run('sleep 1; echo late; exit 3', { background: true })
    await h.disconnect()
    const out = []
    const h2 = await sb.commands.connect(h.pid, { onStdout: (d) => out.push(d) })
    const e = await rejects(h2.wait(), CommandExitError, 'reconnected wait')
    eq([e.exitCode, out.join('')], [3, 'late\n'], 'reconnected result')
  },

  async stdin() {
    const h = await sb.commands.run('cat', { background: true, stdin: true })
    await sb.commands.sendStdin(h.pid, 'hello ')
    await sb.commands.sendStdin(h.pid, 'stdin\n')
    await sb.commands.closeStdin(h.pid)
    const r = await h.wait()
    eq(r.stdout, 'hello stdin\n', 'cat output')
  },

  async pty() {
    let data = ''
    const dec = new TextDecoder()
    const term = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => { data += dec.decode(d) }, timeoutMs: 60_000 })
    await sb.pty.sendInput(term.pid, new TextEncoder().encode('stty size; tty\n'))
    // tty prints after stty has exited: wait for both, not the first alone.
    await until('stty size 24 80, then tty naming /dev/pts/N', async () => data.includes('24 80') && /\/dev\/pts\/\d+/.test(data))
    await sb.pty.resize(term.pid, { cols: 100, rows: 30 })
    await sb.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
    await until('stty size 30 100', async () => data.includes('30 100'))
    eq(await sb.pty.kill(term.pid), true, 'pty kill')
    await term.wait().catch(() => {})
  },

  async files_text_bytes() {
    await sb.files.write('/tmp/t.txt', 'text ✓')
    eq(await sb.files.read('/tmp/t.txt'), 'text ✓', 'text')
    const bytes = new Uint8Array([0, 1, 2, 255, 254, 10])
    await sb.files.write('/tmp/b.bin', bytes.buffer)
    eq(Array.from(await sb.files.read('/tmp/b.bin', { format: 'bytes' })), Array.from(bytes), 'bytes')
    await sb.files.write('/tmp/gz.txt', 'gzipped body', { gzip: true })
    eq(await sb.files.read('/tmp/gz.txt', { gzip: true }), 'gzipped body', 'gzip round trip')
    await sb.files.write('/tmp/oct.txt', 'octet', { useOctetStream: true })
    eq(await sb.files.read('/tmp/oct.txt'), 'octet', 'octet-stream upload')
    const many = await sb.files.write([{ path: '/tmp/m/1.txt', data: 'one' }, { path: '/tmp/m/2.txt', data: 'two' }])
    eq(many.map((w) => w.path), ['/tmp/m/1.txt', '/tmp/m/2.txt'], 'multi-file write')
    eq(await sb.files.read('/tmp/m/2.txt'), 'two', 'multi-file content')
    await rejects(sb.files.read('/tmp/no-such-file'), FileNotFoundError, 'missing file')
  },

  async user() {
    const r = await sb.commands.run('id -u; id -g', { user: 'nobody' })
    eq(r.stdout, '65534\n65534\n', 'command as nobody')
    eq((await sb.commands.run('id -u', { user: 'root' })).stdout, '0\n', 'command as root')
    await sb.files.write('/tmp/own.txt', 'mine', { user: 'nobody' })
    const info = await sb.files.getInfo('/tmp/own.txt')
    eq([info.owner, info.group], ['nobody', 'nogroup'], 'file written as nobody')
    eq(await sb.files.makeDir('/tmp/owndir', { user: 'nobody' }), true, 'makeDir as nobody')
    eq((await sb.files.getInfo('/tmp/owndir')).owner, 'nobody', 'dir made as nobody')
    eq((await sb.commands.run('echo more >> /tmp/own.txt && cat /tmp/own.txt', { user: 'nobody' })).stdout, 'minemore\n', 'nobody can append to its file')
    await rejects(sb.files.write('/tmp/x.txt', 'x', { user: 'no-such-user' }), NotFoundError, 'unknown user')
  },

  async files_20mib() {
    const data = crypto.randomBytes(20 << 20)
    await sb.files.write('/tmp/big.bin', data)
    const back = await sb.files.read('/tmp/big.bin', { format: 'bytes' })
    eq(back.length, data.length, 'size')
    eq(crypto.createHash('sha256').update(back).digest('hex'), crypto.createHash('sha256').update(data).digest('hex'), 'digest')
    await sb.files.remove('/tmp/big.bin')
  },

  async files_ops() {
    eq(await sb.files.makeDir('/tmp/d/e'), true, 'makeDir')
    eq(await sb.files.makeDir('/tmp/d/e'), false, 'makeDir of an existing dir')
    await sb.files.write('/tmp/d/e/f.txt', 'f')
    const top = await sb.files.list('/tmp/d')
    eq(top.map((e) => [e.name, e.type]), [['e', 'dir']], 'list depth 1')
    const deep = await sb.files.list('/tmp/d', { depth: 2 })
    eq(deep.map((e) => e.path), ['/tmp/d/e', '/tmp/d/e/f.txt'], 'list depth 2')
    const info = await sb.files.getInfo('/tmp/d/e/f.txt')
    eq([info.type, info.size, info.owner], ['file', 1, 'root'], 'getInfo')
    eq(await sb.files.exists('/tmp/d/e/f.txt'), true, 'exists')
    const moved = await sb.files.rename('/tmp/d/e/f.txt', '/tmp/d/g.txt')
    eq(moved.path, '/tmp/d/g.txt', 'rename result')
    eq([await sb.files.exists('/tmp/d/e/f.txt'), await sb.files.exists('/tmp/d/g.txt')], [false, true], 'after rename')
    await sb.commands.run('ln -s /tmp/d/g.txt /tmp/d/ln')
    const link = await sb.files.getInfo('/tmp/d/ln')
    eq([link.type, link.symlinkTarget], ['symlink', '/tmp/d/g.txt'], 'symlink info')
    await sb.files.remove('/tmp/d')
    eq(await sb.files.exists('/tmp/d'), false, 'removed recursively')
  },

  async watch_dir() {
    await sb.files.makeDir('/tmp/w')
    const events = []
    const h = await sb.files.watchDir('/tmp/w', (e) => events.push(e.type + ':' + e.name), { recursive: true })
    await sb.files.write('/tmp/w/a.txt', 'a')
    await sb.files.makeDir('/tmp/w/sub')
    await sleep(200)
    await sb.commands.run('echo x > /tmp/w/sub/b.txt; mv /tmp/w/a.txt /tmp/w/c.txt; rm /tmp/w/c.txt')
    const want = ['create:a.txt', 'write:a.txt', 'create:sub', 'create:sub/b.txt', 'rename:a.txt', 'create:c.txt', 'remove:c.txt']
    await until('events ' + want.join(' '), async () => want.every((w) => events.includes(w)))
    await h.stop()
  },

  async signed_url() {
    await sb.files.write('/tmp/signed.txt', 'signed')
    const url = await sb.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: 60 })
    const res = await fetch(url)
    eq([res.status, await res.text()], [200, 'signed'], 'download by signed URL')
    const bad = await fetch(url.replace(/signature=[^&]+/, 'signature=v1_forged'))
    eq(bad.status, 401, 'forged signature')
    const up = await sb.uploadUrl('/tmp/up.txt')
    const form = new FormData()
    form.append('file', new Blob(['uploaded']), 'up.txt')
    eq((await fetch(up, { method: 'POST', body: form })).status, 200, 'upload by signed URL')
    eq(await sb.files.read('/tmp/up.txt'), 'uploaded', 'uploaded content')
  },

  async host_routing() {
    const host = sb.getHost(49983)
    eq(host, `49983-${sb.sandboxId}.localhost`, 'getHost')
    const api = new URL(process.env.E2B_API_URL)
    const status = await new Promise((resolve, reject) => {
      // envdAccessToken is the token the SDK sends as X-Access-Token.
      const headers = { Host: host, 'X-Access-Token': sb.envdAccessToken }
      http.get({ host: api.hostname, port: api.port, path: '/health', headers }, (res) => { res.resume(); resolve(res.statusCode) }).on('error', reject)
    })
    eq(status, 204, 'envd /health by Host')
    // A server inside the sandbox, reached through getHost(port).
    await sb.files.write('/tmp/www/index.html', 'served from inside')
    const srv = await sb.commands.run('httpd -f -p 127.0.0.1:8080 -h /tmp/www', { background: true, timeoutMs: 0 })
    try {
      let body = ''
      await until('the sandbox web server to answer', async () => {
        const res = await new Promise((resolve) => {
          http.get({ host: api.hostname, port: api.port, path: '/index.html', headers: { Host: sb.getHost(8080) } }, (res) => {
            let b = ''
            res.on('data', (d) => { b += d })
            res.on('end', () => resolve({ status: res.statusCode, body: b }))
          }).on('error', () => resolve({ status: 0 }))
        })
        body = res.body
        return res.status === 200
      })
      eq(body, 'served from inside', 'body through getHost(8080)')
    } finally {
      await sb.commands.kill(srv.pid)
    }
  },

  async api_unreachable_inside() {
    // The sandbox has its own network namespace: the node's E2B listener
    // (on the host's loopback) is not there.
    const api = new URL(process.env.E2B_API_URL)
    const r = await sb.commands.run(`wget -q -T 2 -O- http://127.0.0.1:${api.port}/health; echo rc=$?`)
    // rc=1 is wget's "could not connect" (127 would mean no wget at all).
    assert(r.stdout.includes('rc=1'), 'the E2B API answered from inside the sandbox, or no wget: ' + r.stdout + r.stderr)
  },

  async get_info() {
    const info = await sb.getInfo()
    eq([info.sandboxId, info.templateId, info.state, info.metadata.suite], [sb.sandboxId, template, 'running', runId], 'info')
    assert(info.cpuCount >= 1 && info.memoryMB > 0, 'resources')
    assert(info.endAt > info.startedAt, 'endAt after startedAt')
  },

  async metrics() {
    const h = await sb.commands.run('while :; do :; done', { background: true, timeoutMs: 0 })
    try {
      const [m] = await sb.getMetrics()
      assert(m && m.memUsed > 0 && m.memTotal >= m.memUsed, 'memory: ' + JSON.stringify(m))
      assert(m.diskTotal > 0 && m.diskUsed >= 0 && m.cpuCount >= 1, 'disk and cpus: ' + JSON.stringify(m))
      assert(m.cpuUsedPct > 0, 'a busy loop shows as CPU use: ' + JSON.stringify(m))
    } finally {
      await sb.commands.kill(h.pid)
    }
  },

  async list_filter_pages() {
    const extra = await Promise.all([1, 2].map(() => Sandbox.create(template, { metadata: { suite: runId, role: 'extra' }, timeoutMs: 120_000 })))
    try {
      const p = Sandbox.list({ query: { metadata: { suite: runId } }, limit: 2 })
      const first = await p.nextItems()
      eq([first.length, p.hasNext], [2, true], 'first page')
      const second = await p.nextItems()
      eq([second.length, p.hasNext], [1, false], 'second page')
      const ids = [...first, ...second].map((s) => s.sandboxId).sort()
      eq(ids, [sb.sandboxId, ...extra.map((s) => s.sandboxId)].sort(), 'listed ids')
      const only = await Sandbox.list({ query: { metadata: { suite: runId, role: 'main' } } }).nextItems()
      eq(only.map((s) => s.sandboxId), [sb.sandboxId], 'two-key filter')
      const paused = await Sandbox.list({ query: { metadata: { suite: runId }, state: ['paused'] } }).nextItems()
      eq(paused.length, 0, 'state filter')
    } finally {
      await Promise.all(extra.map((s) => s.kill()))
    }
  },

  async set_timeout() {
    const s2 = await Sandbox.create(template, { timeoutMs: 600_000 })
    await s2.setTimeout(2_000)
    const info = await s2.getInfo()
    assert(info.endAt.getTime() - Date.now() < 3_000, 'endAt moved: ' + info.endAt.toISOString())
    await until('the sandbox to die at its timeout', async () => !(await s2.isRunning()), 15_000)
    await rejects(Sandbox.getInfo(s2.sandboxId), NotFoundError, 'getInfo after the timeout')
  },

  async pause_connect() {
    const s2 = await Sandbox.create(template, { timeoutMs: 600_000 })
    await s2.files.write('/tmp/kept.txt', 'kept')
    const bg = await s2.commands.run('sleep 600', { background: true })
    eq(await s2.pause(), true, 'pause')
    eq(await Sandbox.pause(s2.sandboxId), false, 'pause of a paused sandbox')
    eq((await Sandbox.getInfo(s2.sandboxId)).state, 'paused', 'state after pause')
    const s3 = await Sandbox.connect(s2.sandboxId)
    eq((await s3.getInfo()).state, 'running', 'state after connect')
    eq(await s3.files.read('/tmp/kept.txt'), 'kept', 'file kept')
    assert((await s3.commands.list()).some((p) => p.pid === bg.pid), 'background process kept')
    eq(await s3.kill(), true, 'kill')
    eq(await Sandbox.kill(s2.sandboxId), false, 'kill of a killed sandbox')
  },

  async auto_pause() {
    const s2 = await Sandbox.create(template, { timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } })
    await s2.files.write('/tmp/kept.txt', 'kept')
    await until('the sandbox to pause at its timeout', async () => (await s2.getInfo()).state === 'paused', 15_000)
    const s3 = await Sandbox.connect(s2.sandboxId, { timeoutMs: 60_000 })
    eq((await s3.getInfo()).state, 'running', 'state after connect')
    eq(await s3.files.read('/tmp/kept.txt'), 'kept', 'file kept')
    await sleep(1500)
    eq((await s3.getInfo()).state, 'running', 'connect moved the end')
    await s3.kill()
  },

  async concurrent_50() {
    const n = Number(process.env.E2B_CONCURRENT || 50)
    const sbs = await Promise.all(Array.from({ length: n }, () => Sandbox.create(template, { timeoutMs: 300_000, metadata: { suite: runId, role: 'burst' } })))
    try {
      eq(new Set(sbs.map((s) => s.sandboxId)).size, n, 'distinct sandboxes')
      const rs = await Promise.all(sbs.map((s) => s.commands.run('echo $((6*7))')))
      assert(rs.every((r) => r.stdout === '42\n'), 'every sandbox ran a command')
    } finally {
      await Promise.all(sbs.map((s) => s.kill()))
    }
  },

  async wrong_api_key() {
    await rejects(Sandbox.create(template, { apiKey: 'e2b_' + '0'.repeat(40) }), AuthenticationError, 'wrong key')
    await rejects(Sandbox.list({ apiKey: 'e2b_' + '1'.repeat(40) }).nextItems(), AuthenticationError, 'wrong key on list')
  },

  async unknown_sandbox() {
    await rejects(Sandbox.getInfo('n0000000-000000000000'), NotFoundError, 'getInfo')
    await rejects(Sandbox.connect('n0000000-000000000000'), NotFoundError, 'connect')
    await rejects(Sandbox.setTimeout('nonsense', 1000), NotFoundError, 'setTimeout')
    eq(await Sandbox.kill('n0000000-000000000000'), false, 'kill of unknown')
  },

  async kill() {
    eq(await sb.kill(), true, 'kill')
    eq(await sb.isRunning(), false, 'isRunning after kill')
  },
}

const only = (process.env.CASES || '').split(',').filter(Boolean)
for (const [name, fn] of Object.entries(cases)) {
  if (only.length && !only.includes(name) && name !== 'create' && name !== 'kill') continue
  const t0 = Date.now()
  try {
    await fn()
    console.log(JSON.stringify({ case: name, ok: true, ms: Date.now() - t0 }))
  } catch (e) {
    console.log(JSON.stringify({ case: name, ok: false, ms: Date.now() - t0, error: String(e?.stack || e) }))
    if (name === 'create') break
  }
}
