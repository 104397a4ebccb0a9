"""The side-by-side's compact summary from the logs in a folder (device_sidebyside.sh's $OUT):

    a_bench.log        fsdp-jobs `bench step --device cuda` (its JSON at the end): the job and the hand loop
    proj_*.log         the fsdp-jobs job with train.compile=true, and with train.float8 (a PC_RESULT line each)
    tt_*.log           torchtitan through deploy/gpu-sidebyside/run_tt.py (a TT_RESULT line each)

    python deploy/gpu-sidebyside/summarize.py DIR

Per variant: tokens/s per GPU and MFU from the mean step time of steps 11..N (total tokens / total time), the
step time, peak memory (max_memory_allocated: the project's measure; max_reserved: what torchtitan logs),
and the ratio to the project's job. MFU: the project's FLOPs per token (6 N + 12 L d T, N = 1,235,814,400 for
llama3_1b) over 989 TFLOP/s."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

def _json_tail(text: str) -> Optional[dict]:
    """The last top-level JSON object printed with indent=2 (a line that is exactly '{')."""
    starts = [m.start() for m in re.finditer(r"(?m)^\{$", text)]
    for s in reversed(starts):
        try:
            return json.JSONDecoder().raw_decode(text[s:])[0]
        except ValueError:
            continue
    return None


def _tagged(text: str, tag: str) -> Optional[dict]:
    lines = [ln for ln in text.splitlines() if ln.startswith(tag + " ")]
    if not lines:
        return None
    try:
        return json.loads(lines[-1][len(tag) + 1:])
    except ValueError:
        return None


def _last_error(text: str) -> str:
    """The last line that names an error, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hits = [ln for ln in lines if re.search(r"Error|Exception|Traceback|FAILED|Killed|timed out", ln)]
    return ((hits or lines or ["(empty log)"])[-1])[:300]


def rows(folder: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def read(name: str) -> Optional[str]:
        p = folder / name
        return p.read_text(errors="replace") if p.exists() else None

    a = read("a_bench.log")
    if a is not None:
        res = _json_tail(a)
        if res and "job" in res:
            for order, side, label in ((0, "job", "fsdp-jobs job (bench step)"),
                                       (1, "hand", "fsdp-jobs hand loop (bench step)")):
                r = res[side]
                out.append({"_order": order, "variant": label, "tokens_per_s": r["tokens_per_s"], "mfu_pct": 100 * r["mfu"],
                            "step_s": r["step_s_mean"], "peak_alloc_gib": r["peak_mem_gb"], "peak_reserved_gib": None,
                            "note": f"{res.get('gpu', '?')}, torch {res.get('torch', '?')}, "
                                    f"n_params {res.get('n_params')}, steps {res.get('steps')}"})
        else:
            out.append({"_order": 0, "variant": "fsdp-jobs bench step", "error": _last_error(a)})

    projects = {"proj_compile": (4, "fsdp-jobs job, train.compile=true"),
                "proj_f8": (8, "fsdp-jobs job, compile + float8 tensorwise"),
                "proj_f8_rowwise": (10, "fsdp-jobs job, compile + float8 rowwise")}
    for stem, (order_of, label) in projects.items():
        pc = read(f"{stem}.log")
        if pc is None:
            continue
        r = _tagged(pc, "PC_RESULT")
        if r and r.get("tokens_per_s"):
            out.append({"_order": order_of, "variant": label, **{k: r[k] for k in (
                "tokens_per_s", "mfu_pct", "step_s", "peak_alloc_gib")}, "peak_reserved_gib": None,
                "note": f"steps measured {r.get('steps_measured')}"})
        else:
            out.append({"_order": order_of, "variant": label, "error": _last_error(pc)})

    order = {"tt_nocompile": 2, "tt_compile": 3, "tt_foreach": 5, "tt_untied": 6, "tt_f8": 9, "tt_f8_rowwise": 11}
    for log in sorted(folder.glob("tt_*.log")):
        text = log.read_text(errors="replace")
        r = _tagged(text, "TT_RESULT")
        label = f"torchtitan {log.stem[3:]}"
        if r and r.get("tokens_per_s"):
            label = (f"torchtitan {r.get('torchtitan')} {'tied' if r.get('tied') else 'untied'}"
                     f"{', compile' if r.get('compile') else ''}, AdamW {r.get('optimizer_impl')}"
                     + {"tt_f8": ", float8 tensorwise", "tt_f8_rowwise": ", float8 rowwise"}.get(log.stem, ""))
            tt_mfu = r["mfu_pct"] * r["torchtitan_flops_per_token"] / r["flops_per_token"]
            logged = [w for w in r.get("windows", [])][2:]
            out.append({"_order": order.get(log.stem, 7), "variant": label, "tokens_per_s": r["tokens_per_s"],
                        "mfu_pct": r["mfu_pct"],
                        "step_s": r.get("local_batch", 4) * r.get("seq_len", 2048) / r["tokens_per_s"],
                        "peak_alloc_gib": r["peak_alloc_gib"],
                        "peak_reserved_gib": r["peak_reserved_gib"],
                        "note": f"{r.get('device')}, torch {r.get('torch')}, n_params {r.get('n_params')}, "
                                f"steps measured {r.get('steps_measured')}, MFU by torchtitan's own FLOPs count "
                                f"{tt_mfu:.2f}%, logged tps per window "
                                f"{[round(w['tps']) for w in logged]}"
                                + ("" if r.get("ok") else ", RUN DID NOT FINISH")})
        else:
            out.append({"_order": order.get(log.stem, 7), "variant": label, "error": _last_error(text)})
    return sorted(out, key=lambda r: r["_order"])


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else Path(".")
    table = rows(folder)
    base = next((r for r in table if r["variant"].startswith("fsdp-jobs job (bench") and "error" not in r), None)
    print(f"{'variant':<50} {'tokens/s':>9} {'MFU%':>6} {'step_s':>7} {'alloc_GiB':>9} {'resv_GiB':>8} {'vs job':>7}")
    for r in table:
        if "error" in r:
            print(f"{r['variant']:<50} FAILED: {r['error']}")
            continue
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}" if base else "-"
        resv = f"{r['peak_reserved_gib']:.2f}" if r.get("peak_reserved_gib") is not None else "-"
        print(f"{r['variant']:<50} {r['tokens_per_s']:>9.0f} {r['mfu_pct']:>6.2f} {r['step_s']:>7.4f} "
              f"{r['peak_alloc_gib']:>9.2f} {resv:>8} {ratio:>7}")
    for r in table:
        if r.get("note"):
            print(f"  {r['variant']}: {r['note']}")
    print("SUMMARY_JSON " + json.dumps([{k: v for k, v in r.items() if k != "_order"} for r in table]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
