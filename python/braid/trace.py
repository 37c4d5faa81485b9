#!/usr/bin/env python3
"""braid_trace: merges the flight recorder's dumps of a job's ranks and says what happened.

    braid_trace DIR_OR_FILE... [--json] [--all]

Each rank of a communicator writes braid_trace.<comm>.<id>.rank<R>.json into
BRAID_TRACE_DIR on a failure or timeout, on SIGUSR1, or on Communicator.dump_trace()
(docs/observability.md). This tool reads them (Python's standard library only; it also
runs where braid is not installed), groups them by communicator, and reports in plain
words: where each rank stands, which ranks left no dump, which rank the others wait for
and at which collective and step, and at which sequence number ranks issued different
calls. `--json` prints the verdicts as JSON; `--all` lists every rank's line even when
nothing is wrong. Exit status: 0 when nothing looks wrong, 1 when a verdict names a
problem, 2 on unreadable input."""
import argparse
import json
import os
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Tuple


def load(paths: List[str]) -> List[dict]:
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += [os.path.join(p, f) for f in sorted(os.listdir(p))
                      if f.startswith("braid_trace.") and f.endswith(".json")]
        else:
            files.append(p)
    dumps = []
    for f in files:
        try:
            with open(f) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as e:
            raise SystemExit(f"braid_trace: cannot read {f}: {e}")
        if not isinstance(d, dict) or "braid_trace" not in d:
            raise SystemExit(f"braid_trace: {f} is not a braid flight-recorder dump")
        d["_file"] = f
        dumps.append(d)
    return dumps


def signature(e: dict) -> Tuple:
    """What every rank must agree on for one sequence number."""
    if "count" not in e:
        return (e["call"],)
    root = e.get("root", -1)
    return (e["call"], e["count"], e["dtype"], e["op"], root if e["call"] in ("broadcast", "reduce") else -1)


def describe_sig(s: Tuple) -> str:
    if len(s) == 1:
        return s[0]
    call, count, dtype, op, root = s
    out = f"{call} of {count} x {dtype}"
    if call in ("allreduce", "reduce", "reduce_scatter"):
        out += f", {op}"
    if root >= 0:
        out += f", root {root}"
    return out


def ranks_text(rs) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def short(e: dict) -> str:
    """'allreduce #58 (ring, 1024 x f32, sum)': the name without ' on rank r/n'."""
    n = e.get("name", "")
    at = n.rfind(" on rank ")
    return n[:at] if at > 0 else n


class Rank:
    """Where one rank stands, from its dump."""

    def __init__(self, d: dict):
        self.d = d
        self.rank = d["rank"]
        colls = [e for e in d["entries"] if e.get("seq", 0) > 0]
        self.by_seq: Dict[int, dict] = {}
        for e in colls:
            self.by_seq[e["seq"]] = e  # a later entry of the same number (live) wins
        done = [e["seq"] for e in colls if e["state"] == "done"]
        self.last_done: Optional[dict] = self.by_seq[max(done)] if done else None
        active = [e for e in colls if e["state"] in ("running", "failed")]
        self.current: Optional[dict] = min(active, key=lambda e: e["seq"]) if active else None
        waiting = [e for e in colls if e["state"] in ("queued", "not_run")]
        self.next_issued: Optional[dict] = min(waiting, key=lambda e: e["seq"]) if waiting else None
        self.p2p = [e for e in d["entries"] if e.get("p2p_seq", 0) > 0 and e["state"] in ("running", "failed")]

    def frontier(self) -> int:
        """The collective this rank is in, or the next it would start."""
        if self.current is not None:
            return self.current["seq"]
        return (self.last_done["seq"] if self.last_done else 0) + 1

    def waits_on(self) -> List[int]:
        out = set()
        for e in ([self.current] if self.current else []) + self.p2p:
            out.update(e.get("waiting_on", []))
        return sorted(out)

    def line(self) -> str:
        parts = []
        if self.last_done:
            parts.append(f"done through {short(self.last_done)}")
        else:
            parts.append("no collective done")
        for e in ([self.current] if self.current else []) + self.p2p:
            verb = "failed in" if e["state"] == "failed" else "in"
            s = f"{verb} {short(e)}, step {e.get('steps_done', 0)}/{e.get('steps', 0)}"
            late = [p for p in e.get("peers", []) if p["rank"] in e.get("waiting_on", [])]
            for p in late:
                bits = []
                if p["recvs_posted"] > p["recvs_done"]:
                    bits.append(f"received {p['bytes_received']} of {p['bytes_to_recv']} bytes"
                                f" (step {p['next_recv_step']})")
                if p["sends_posted"] > p["sends_done"]:
                    bits.append(f"sent {p['bytes_sent']} of {p['bytes_to_send']} bytes"
                                f" (step {p['next_send_step']})")
                s += f"; from/to rank {p['rank']}: " + ", ".join(bits)
            parts.append(s)
        if self.current is None and self.next_issued is not None:
            parts.append(f"next issued: {short(self.next_issued)} ({self.next_issued['state'].replace('_', ' ')})")
        return "; ".join(parts)


def analyse(group: List[dict]) -> Tuple[List[str], List[str], List[dict]]:
    """Lines per rank, verdicts (plain words), verdicts as data."""
    size = max(d["size"] for d in group)
    ranks: Dict[int, Rank] = {}
    for d in sorted(group, key=lambda d: d.get("time_us", 0)):
        ranks[d["rank"]] = Rank(d)  # the latest dump of a rank wins
    missing = [r for r in range(size) if r not in ranks]
    lines = [f"  rank {r}: " + (ranks[r].line() if r in ranks else "no dump") for r in range(size)]
    verdicts: List[str] = []
    data: List[dict] = []

    # Ranks that issued different calls under one sequence number.
    seqs = sorted({s for rk in ranks.values() for s in rk.by_seq})
    for s in seqs:
        sigs = defaultdict(list)
        for r, rk in ranks.items():
            if s in rk.by_seq:
                sigs[signature(rk.by_seq[s])].append(r)
        if len(sigs) > 1:
            groups = sorted(sigs.items(), key=lambda kv: (-len(kv[1]), kv[1]))
            text = "; ".join(f"{ranks_text(rs)} issued {describe_sig(sig)}" for sig, rs in groups)
            verdicts.append(f"ranks issued different calls as collective #{s}: {text}")
            data.append({"kind": "mismatch", "seq": s,
                         "calls": [{"call": describe_sig(sig), "ranks": sorted(rs)} for sig, rs in groups]})

    # Who the others wait for: follow the waits to a rank that is absent, behind, or waits on nobody.
    fronts = {r: rk.frontier() for r, rk in ranks.items()}
    ahead = max(fronts.values()) if fronts else 0
    waiters = defaultdict(set)
    for r, rk in ranks.items():
        for p in rk.waits_on():
            waiters[p].add(r)
    blocked = [r for r, rk in ranks.items() if rk.waits_on()]

    def why_stuck(r: int, seq: int, since_us: int) -> Tuple[Optional[str], Optional[int]]:
        """Why rank r holds up a rank waiting in collective `seq` since `since_us`: (reason,
        None) when r is the cause, (None, s) to follow r's own waits in collective s,
        (None, None) when r does not hold it up (it is past `seq`, or its dump was taken
        too soon after the wait began to tell: dumps are not taken at one instant)."""
        if r in missing:
            return "left no dump (stopped, hung outside braid, or killed before it could write one)", None
        rk = ranks[r]
        if rk.d.get("time_us", 0) - since_us < kBehindUs:
            return None, None
        if rk.current is None:
            last = rk.last_done["seq"] if rk.last_done else 0
            if last >= seq:
                return None, None
            if rk.next_issued is not None and rk.next_issued["seq"] <= seq:
                return f"issued {short(rk.next_issued)} but has not started it", None
            return (f"has not issued collective #{seq}" +
                    (f": its last was {short(rk.last_done)}" if rk.last_done else "") +
                    " (busy outside braid, or it issued fewer calls)"), None
        cur = rk.current["seq"]
        if cur > seq:
            return None, None
        if cur < seq and not rk.waits_on():
            return f"is still in {short(rk.current)}", None
        return None, cur

    culprits: Dict[int, str] = {}
    cycles: List[List[int]] = []
    for start in blocked:
        seen = set()
        r, seq = start, ranks[start].frontier()
        while r not in seen:
            seen.add(r)
            nxt = ranks[r].waits_on()
            if not nxt:
                break
            since = ranks[r].current.get("start_us", 0) if ranks[r].current else 0
            # Prefer a peer that explains the wait (absent, or not in the collective).
            verdict = [(p, why_stuck(p, seq, since)) for p in nxt]
            causes = [(p, v[0]) for p, v in verdict if v[0] is not None]
            if causes:
                for p, why in causes:
                    culprits.setdefault(p, why)
                break
            follow = [(p, v[1]) for p, v in verdict if v[1] is not None]
            if not follow:
                break
            r, seq = follow[0]
            if r in seen:  # every rank on the way waits on the next: a cycle of waits
                cycles.append(sorted(seen))
    for r, reason in sorted(culprits.items()):
        who = sorted(waiters.get(r, set()) - {r})
        where = ""
        for w in who:
            cur = ranks[w].current
            if cur is not None:
                where = f" in {short(cur)}"
                break
        text = f"rank {r} is behind: it {reason}"
        if who:
            text += f"; {ranks_text(who)} {'waits' if len(who) == 1 else 'wait'} on it{where}"
        verdicts.append(text)
        data.append({"kind": "behind", "rank": r, "why": reason, "waited_on_by": who})
    for r in missing:
        if r not in culprits:
            verdicts.append(f"rank {r} left no dump (no rank waits on it)")
            data.append({"kind": "no_dump", "rank": r})
    # Behind without anyone blocked on it (a dump taken while the job runs).
    for r, f in sorted(fronts.items()):
        if r not in culprits and f < ahead - 1 and not blocked:
            verdicts.append(f"rank {r} is behind: at collective #{f} while {ranks_text([q for q, g in fronts.items() if g == ahead])} "
                            f"at #{ahead}")
            data.append({"kind": "behind", "rank": r, "at": f, "others_at": ahead})
    for c in cycles[:1]:
        verdicts.append(f"{ranks_text(c)} wait on each other in a cycle (ranks that issued their sends and "
                        "receives in an order that cannot complete?): see each rank's line")
        data.append({"kind": "cycle", "ranks": c})
    link_verdicts(ranks, verdicts, data)
    return lines, verdicts, data


def median(xs: List[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return 0.0 if n == 0 else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


# A link slower than this fraction of its class's median is named, as is a rank whose data
# comes this many times later than the median rank's (and at least kLateMs late).
kSlowFraction = 1 / 3
# A rank is behind only if its dump, taken this long after another began to wait on it,
# shows it has not got there (a periodic dump of each rank is taken at its own instant).
kBehindUs = 500_000
kLateFactor = 3.0
kLateMs = 1.0
kMinBytes = 4 << 20  # a link's rate counts once this much went over it


def link_verdicts(ranks: Dict[int, "Rank"], verdicts: List[str], data: List[dict]) -> None:
    """Slow links (measured throughput of large sends far below the other links of the same
    class in the job) and late ranks (their first data of large collectives reaching their
    peers far later than other ranks' does), from the dumps' "links"."""
    links = []  # (from, to, class, MB/s, model MB/s)
    lags = defaultdict(list)  # peer -> mean lag (ms) as each observer saw it
    for r, rk in ranks.items():
        for l in rk.d.get("links", []):
            if l.get("bytes", 0) >= kMinBytes and l.get("MBps", 0) > 0:
                cls = l["class"] if l.get("transport", l["class"]) == l["class"] else f"{l['transport']} over {l['class']}"
                links.append((r, l["peer"], cls, l["MBps"], l.get("model_MBps", 0)))
            if l.get("arrivals", 0) > 0:
                lags[l["peer"]].append(l["mean_lag_ms"])
    by_class = defaultdict(list)
    for x in links:
        by_class[x[2]].append(x[3])
    slow = []
    for src, dst, cls, rate, model in links:
        m = median(by_class[cls])
        if len(by_class[cls]) >= 3 and rate < kSlowFraction * m:
            slow.append((src, dst, cls, rate, m, model))
    for src, dst, cls, rate, m, model in sorted(slow):
        text = (f"slow link: rank {src} -> rank {dst} ({cls}) moved {rate:.1f} MB/s, {rate / m:.2f}x the median of "
                f"the job's {len(by_class[cls])} {cls} links ({m:.1f} MB/s)")
        if model > 0:
            text += f"; the cost model expects {model:.0f} MB/s"
        verdicts.append(text)
        data.append({"kind": "slow_link", "from": src, "to": dst, "class": cls, "MBps": rate,
                     "class_median_MBps": m, "model_MBps": model})
    if slow:
        common = set.intersection(*[{s[0], s[1]} for s in slow])
        if len(slow) > 1 and len(common) == 1:
            r = common.pop()
            verdicts.append(f"every slow link touches rank {r}: its host's link (or NIC) is the likely cause")
            data.append({"kind": "slow_host", "rank": r})
    seen = {p: sum(v) / len(v) for p, v in lags.items()}
    m = median(list(seen.values()))
    for p, lag in sorted(seen.items()):
        if len(seen) >= 3 and lag > kLateMs and lag > kLateFactor * m:
            slow_too = any(p in (s[0], s[1]) for s in slow)
            verdicts.append(f"late rank: rank {p}'s first data reaches its peers {lag:.1f} ms after they start "
                            f"(median of the ranks: {m:.1f} ms)" +
                            ("; its links are slow too, which may be the whole reason" if slow_too else ""))
            data.append({"kind": "late_rank", "rank": p, "lag_ms": lag, "median_ms": m})


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="braid_trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="directories (BRAID_TRACE_DIR) or dump files")
    ap.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    ap.add_argument("--all", action="store_true", help="list every rank even when nothing is wrong")
    ap.add_argument("--live", type=float, nargs="?", const=10.0, metavar="SECONDS",
                    help="report again every SECONDS (default 10) from the latest dumps, as a job with "
                         "BRAID_REPORT_SECONDS writes them, until interrupted")
    a = ap.parse_args(argv)
    if a.live:
        import time
        try:
            while True:
                print(time.strftime("--- %H:%M:%S"), flush=True)
                report(a)
                sys.stdout.flush()
                time.sleep(a.live)
        except KeyboardInterrupt:
            return 0
    return report(a)


def report(a) -> int:
    try:
        dumps = load(a.paths)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    if not dumps:
        print("braid_trace: no dumps found in " + ", ".join(a.paths), file=sys.stderr)
        return 2
    comms = defaultdict(list)
    for d in dumps:
        comms[(d["comm"], d["comm_id"])].append(d)
    problems = False
    out = []
    for (name, cid), group in sorted(comms.items()):
        lines, verdicts, data = analyse(group)
        problems = problems or bool(verdicts)
        reasons = sorted({d["reason"][:120] for d in group})
        if a.json:
            out.append({"comm": name, "comm_id": cid, "size": max(d["size"] for d in group),
                        "ranks": sorted(d["rank"] for d in group), "verdicts": data, "text": verdicts})
            continue
        print(f"communicator '{name}' ({cid}): {max(d['size'] for d in group)} ranks, dumps from "
              f"{ranks_text(d['rank'] for d in group)}; why: {' | '.join(reasons)}")
        if verdicts or a.all:
            print("\n".join(lines))
        for v in verdicts:
            print("=> " + v)
        if not verdicts:
            print("=> nothing wrong: every rank is at the same place")
    if a.json:
        print(json.dumps(out, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
