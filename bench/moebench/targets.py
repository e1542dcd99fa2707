"""Issue 21's performance targets (--targets): its points, each point's floor, bound, targets and
verdict, the run's summary (points met, the missed ones, geometric means of moejit/floor), and the saved
table of a run's times that a later run compares with (bench/saved/h200_targets.json by default).
Plain Python (no torch): the dry run and the tests use it without a GPU."""

import collections
import json
import math
import os

TARGET_PRESETS = ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-next-80b-a3b", "kimi-k2"]
TARGET_TOKENS = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192, 16384, 32768]

# moejit ms / floor ms at most this where the floor is the touched weights' read time ("bandwidth"),
# at most OTHER_LIMIT where it is the FLOPs' time at the matmul rate ("compute").
BANDWIDTH_LIMIT = 1.15
OTHER_LIMIT = 1.25
# (preset, T): moejit ms at most this.
LATENCY_MS = {("qwen3-30b-a3b", 1): 0.021}
# preset: (from T, FLOP/s): moejit's FLOP rate at least this at every T >= from T.
PREFILL_RATE = {"mixtral-8x7b": (4096, 680e12), "qwen3-30b-a3b": (8192, 620e12), "deepseek-v3": (8192, 620e12)}
# --self-test --targets: a tiny preset is judged by the rules of the preset it shrinks.
RULES_OF = {"tiny-mixtral": "mixtral-8x7b", "tiny-qwen3": "qwen3-30b-a3b", "tiny-deepseek": "deepseek-v3"}

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TABLE = os.path.join(BENCH_DIR, "saved", "h200_targets.json")
DEFAULT_TABLE_SHOWN = "bench/saved/h200_targets.json"
DEFAULT_NOISE_MARGIN_PCT = 3.0
# --budget-s under --targets: a graph holds <= --graph-target-ms (50) of calls, so 20 replays cost <= 1 s
# below 50 ms a call; the slowest prefill points (DeepSeek-V3, Kimi-K2 at T=32768: ~40-60 ms a call, one
# call a graph) get ~16-25 replays.
TARGETS_BUDGET_S = 1.0

# kind: "ratio" (moejit/floor <= limit), "ms" (moejit ms <= limit), "rate" (FLOP/s >= limit); label: the
# table's "target" cell.
Target = collections.namedtuple("Target", "kind limit label")


class Verdict(collections.namedtuple("Verdict", "floor_ms bound ratio rate targets missed")):
    """One point judged: its floor and bound, moejit/floor, moejit's FLOP/s, its targets and what it
    missed (one text per missed target, empty when every target was met)."""

    @property
    def met(self):
        return not self.missed

    def target_cell(self):
        return ", ".join(t.label for t in self.targets)

    def met_cell(self):
        return "met" if self.met else "MISSED"


def floor_and_bound(touched_bytes, flops, read_bw, matmul_rate):
    """(floor ms, "bandwidth" or "compute"): the larger of the touched weights' read time and the
    FLOPs' time at the matmul rate; ties count as bandwidth-bound."""
    read_ms = touched_bytes / read_bw * 1e3
    compute_ms = flops / matmul_rate * 1e3
    return (read_ms, "bandwidth") if read_ms >= compute_ms else (compute_ms, "compute")


def targets_of(preset, tokens, bound):
    """The targets of one point: the ratio limit of its bound, and where the issue names them, a latency
    and a prefill FLOP rate."""
    rules = RULES_OF.get(preset, preset)
    found = [Target("ratio", BANDWIDTH_LIMIT, f"<={BANDWIDTH_LIMIT:g}x bw") if bound == "bandwidth"
             else Target("ratio", OTHER_LIMIT, f"<={OTHER_LIMIT:g}x")]
    if (rules, tokens) in LATENCY_MS:
        limit = LATENCY_MS[(rules, tokens)]
        found.append(Target("ms", limit, f"<={limit * 1e3:g} us"))
    if rules in PREFILL_RATE and tokens >= PREFILL_RATE[rules][0]:
        rate = PREFILL_RATE[rules][1]
        found.append(Target("rate", rate, f">={rate / 1e12:g} TF/s"))
    return found


def judge(preset, tokens, ms, touched_bytes, flops, read_bw, matmul_rate):
    """The Verdict of moejit's `ms` at one point, from the bytes it touched, its FLOPs and the ceilings."""
    floor_ms, bound = floor_and_bound(touched_bytes, flops, read_bw, matmul_rate)
    ratio = ms / floor_ms
    rate = flops / (ms * 1e-3)
    targets = targets_of(preset, tokens, bound)
    missed = []
    for t in targets:
        if t.kind == "ratio" and ratio > t.limit:
            missed.append(f"limit {t.limit:g}x")
        elif t.kind == "ms" and ms > t.limit:
            missed.append(f"{ms * 1e3:.1f} us > {t.limit * 1e3:g} us")
        elif t.kind == "rate" and rate < t.limit:
            missed.append(f"{rate / 1e12:.0f} TF/s < {t.limit / 1e12:g} TF/s")
    return Verdict(floor_ms, bound, ratio, rate, targets, missed)


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def n_points(n):
    return f"{n} point" + ("" if n == 1 else "s")


def summary_lines(verdicts, unmeasured=()):
    """The run's verdict in a few lines. verdicts: [(preset, T, Verdict)] in run order; unmeasured:
    ["preset T=..", ...] points that have no time (an error, a skipped preset)."""
    met = sum(v.met for _, _, v in verdicts)
    lines = [f"Targets: {met} of {len(verdicts)} measured points met"
             + (f"; {len(unmeasured)} not measured: {', '.join(unmeasured)}" if unmeasured else "")]
    missed = [f"{name} T={t}: {v.ratio:.2f}x floor ({'; '.join(v.missed)})" for name, t, v in verdicts if not v.met]
    lines.append(f"Missed ({len(missed)}): " + (", ".join(missed) if missed else "none"))
    by_preset = collections.OrderedDict()
    for name, _, v in verdicts:
        by_preset.setdefault(name, []).append(v.ratio)
    if by_preset:
        cells = [f"{name} {geomean(r):.3f} ({n_points(len(r))})" for name, r in by_preset.items()]
        overall = geomean(v.ratio for _, _, v in verdicts)
        lines.append(f"Geometric mean of moejit/floor: {', '.join(cells)}; overall {overall:.3f} "
                     f"({n_points(len(verdicts))})")
    return lines


# -- the saved table: {"meta": {commit, date, device, command, ceilings}, "points": {preset: {"T": ms}}}

def save_table(path, meta, points):
    """Writes the table (points: {preset: {T: ms}}) to path, creating its folder; written to a temporary
    file first, so an interrupted run leaves the previous table whole."""
    table = {"meta": meta,
             "points": {name: {str(t): ms for t, ms in sorted(times.items())} for name, times in points.items()}}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def load_table(path):
    """(table or None, a line saying what was loaded or why nothing was). The table's points come back as
    {preset: {T (int): ms}}; a missing or unreadable file is not an error: the run goes on without it."""
    if not os.path.exists(path):
        return None, (f"{path} does not exist (no saved run yet: a run with --save-table writes one); the "
                      "prev columns show '-'")
    try:
        with open(path) as f:
            table = json.load(f)
        points = {name: {int(t): float(ms) for t, ms in times.items()} for name, times in table["points"].items()}
        meta = table.get("meta", {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"{path} could not be read ({type(e).__name__}: {e}); the prev columns show '-'"
    count = sum(len(t) for t in points.values())
    ceilings = meta.get("ceilings", {})
    seen = (f"{path}: {count} points, commit {meta.get('commit', '?')}, {meta.get('date', '?')}, "
            f"{meta.get('device', '?')}")
    if ceilings:
        seen += (f"; its ceilings {ceilings.get('read_tb_s', '?')} TB/s, "
                 f"{ceilings.get('matmul_tflop_s', '?')} TFLOP/s")
    return {"meta": meta, "points": points}, seen


Comparison = collections.namedtuple("Comparison", "prev_ms ratio slower")


def compare_point(table, preset, tokens, ms, margin_pct):
    """The point against the saved table: (prev ms, new/prev, slower by more than margin_pct %); prev ms
    and the ratio are None where the table has no such point (or there is no table, or no new ms)."""
    prev = (table or {}).get("points", {}).get(preset, {}).get(tokens)
    if prev is None or ms is None or prev <= 0:
        return Comparison(prev, None, False)
    ratio = ms / prev
    return Comparison(prev, ratio, ratio > 1 + margin_pct / 100)


def compare_cells(cmp):
    """The rows' "prev ms" and "new/prev" cells."""
    if cmp.ratio is None:
        return [f"{cmp.prev_ms:.4g}" if cmp.prev_ms else "-", "-"]
    return [f"{cmp.prev_ms:.4g}", f"{cmp.ratio:.3f}" + (" SLOWER" if cmp.slower else "")]


def comparison_lines(comparisons, margin_pct, table_line, meta_now=None, meta_saved=None):
    """The summary of the comparison. comparisons: [(preset, T, Comparison)]; the two runs' metas, when
    given, add how their ceilings and devices compare (a slower machine is slower everywhere)."""
    compared = [(n, t, c) for n, t, c in comparisons if c.ratio is not None]
    slower = [f"{n} T={t} {c.prev_ms:.4g} -> {c.prev_ms * c.ratio:.4g} ms ({100 * (c.ratio - 1):+.1f}%)"
              for n, t, c in compared if c.slower]
    lines = [f"Compared with {table_line}"]
    if meta_now and meta_saved:
        lines.extend(machine_lines(meta_now, meta_saved))
    if compared:
        lines.append(f"Slower than the saved run by more than {margin_pct:g}% ({len(slower)} of {len(compared)} "
                     f"compared points): " + (", ".join(slower) if slower else "none"))
        lines.append(f"Geometric mean of new/prev: {geomean(c.ratio for _, _, c in compared):.3f}")
    else:
        lines.append("No point of this run is in the saved table.")
    missing = sum(c.prev_ms is None for _, _, c in comparisons)
    if missing and compared:
        lines.append(f"{n_points(missing)} of this run {'is' if missing == 1 else 'are'} not in the saved table.")
    return lines


def machine_lines(meta_now, meta_saved):
    """How this run's ceilings compare with the saved run's, and whether the device differs."""
    now, then = meta_now.get("ceilings", {}), meta_saved.get("ceilings", {})
    cells = []
    for key, what, unit in (("read_tb_s", "read", "TB/s"), ("matmul_tflop_s", "matmul", "TFLOP/s")):
        a, b = now.get(key), then.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
            cells.append(f"{what} {a:g} vs {b:g} {unit} (x{a / b:.3f})")
    lines = [f"Ceilings, this run vs the saved run: {'; '.join(cells)}"] if cells else []
    if meta_now.get("device") != meta_saved.get("device"):
        lines.append(f"The saved run was on another device: {meta_saved.get('device', '?')}")
    return lines
