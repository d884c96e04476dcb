"""``python3 -m corral.bench``: rollouts per second of the README's RL
rollout example, at one or more concurrencies, from one asyncio loop.

One episode (the same as ``corral bench sdk`` runs with the Go SDK):
create a busybox sandbox (64 MiB), write a task file, run three commands
(set up, "agent" step, check), read the answer file, score it, delete.

    python3 -m corral.bench --addr http://127.0.0.1:7070 --concurrency 64 256

Every sandbox is labelled ``corral-bench=<label>``; the run deletes any
left over at the end and reports how many it found (``leaked``).
"""

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from .client import AsyncClient
from .errors import CorralError

__all__ = ["episode", "measure", "main"]

LABEL_KEY = "corral-bench"


async def episode(c: AsyncClient, n: int, labels: Dict[str, str], image: str = "busybox") -> bool:
    """One rollout: create, 3 commands, a file write and read, score, delete.

    The "task" is to sum 1..n; the episode scores True when the answer the
    sandbox wrote is right.
    """
    async with c.sandbox(image=image, memory_mb=64, labels=labels, idle_timeout=600) as sb:
        await sb.files.write("/tmp/task/n.txt", f"{n}\n")
        setup = await sb.run("mkdir -p /tmp/work && cp /tmp/task/n.txt /tmp/work/")
        agent = await sb.run(["sh", "-c", 'n=$(cat n.txt); echo $((n * (n + 1) / 2)) > answer.txt'],
                             cwd="/tmp/work", timeout=30)
        check = await sb.run(["ls", "/tmp/work"])
        if not (setup.ok and agent.ok and check.ok):
            raise RuntimeError(f"episode {n}: a command failed: {agent.stderr_text.strip()}")
        answer = await sb.files.read("/tmp/work/answer.txt")
        return int(answer) == n * (n + 1) // 2


async def measure(c: AsyncClient, concurrency: int, episodes: int, label: str,
                  image: str = "busybox") -> Dict[str, Any]:
    """Run episodes on concurrency workers; return the rate and failures."""
    labels = {LABEL_KEY: label}
    next_i = 0
    ok = wrong = failed = 0
    first_error = ""

    async def worker() -> None:
        nonlocal next_i, ok, wrong, failed, first_error
        while next_i < episodes:
            i = next_i
            next_i += 1
            try:
                if await episode(c, 1000 + i, labels, image):
                    ok += 1
                else:
                    wrong += 1
            except (CorralError, RuntimeError, ValueError) as e:
                failed += 1
                first_error = first_error or f"{type(e).__name__}: {e}"

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    secs = time.monotonic() - start
    return {
        "concurrency": concurrency, "episodes": episodes, "solved": ok, "wrong": wrong,
        "errors": failed, "seconds": round(secs, 3),
        "rollouts_per_s": round(ok / secs, 3) if secs > 0 else 0.0,
        "first_error": first_error,
    }


async def sweep(c: AsyncClient, label: str) -> int:
    """Delete every sandbox with the run's label; return how many there were."""
    left = await c.list(labels={LABEL_KEY: label})
    await asyncio.gather(*(c.delete(s.id) for s in left), return_exceptions=True)
    return len(left)


async def run(addr: str, concurrencies: List[int], episodes: int, image: str, label: str,
              log: Any = sys.stderr) -> Dict[str, Any]:
    """Measure each concurrency in turn; episodes 0 means 2 x concurrency."""
    results = []
    async with AsyncClient(addr, max_connections=max(256, max(concurrencies))) as c:
        try:
            for conc in concurrencies:
                n = episodes or 2 * conc
                print(f"python rollouts: {n} episodes, {conc} in flight", file=log, flush=True)
                r = await measure(c, conc, n, label, image)
                r["leaked"] = await sweep(c, label)
                results.append(r)
        finally:
            await sweep(c, label)
    return {"sdk": "python", "python": sys.version.split()[0], "image": image, "label": label,
            "results": results}


def _table(res: Dict[str, Any]) -> str:
    lines = [f"corral.bench (python {res['python']}): image {res['image']}",
             f"{'CONCURRENCY':>11}  {'EPISODES':>8}  {'ERRORS':>6}  {'SECONDS':>8}  {'ROLLOUTS_PER_S':>14}  LEAKED"]
    for r in res["results"]:
        lines.append(f"{r['concurrency']:>11}  {r['episodes']:>8}  {r['errors']:>6}  {r['seconds']:>8.2f}  "
                     f"{r['rollouts_per_s']:>14.2f}  {r['leaked']}")
        if r["first_error"]:
            lines.append(f"  first error: {r['first_error']}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python3 -m corral.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default=None, help="server address (default $CORRAL_ADDR or the unix socket)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 256], help="episodes in flight")
    p.add_argument("--episodes", type=int, default=0, help="episodes per concurrency (default 2 x concurrency)")
    p.add_argument("--image", default="busybox")
    p.add_argument("--label", default="", help="value of the corral-bench label (default random)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if any(c < 1 for c in a.concurrency):
        p.error("--concurrency must be positive")
    label = a.label or "py" + os.urandom(5).hex()
    res = asyncio.run(run(a.addr or "", a.concurrency, a.episodes, a.image, label))
    print(json.dumps(res) if a.json else _table(res))
    bad = any(r["errors"] or r["leaked"] for r in res["results"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
