"""The timeline's pictures (:mod:`encoding.memory.timeline`): a PNG (matplotlib, loaded here only) and a
self-contained interactive HTML page (inline SVG drawn by inline JavaScript: no network, no CDN).

Both draw, per strategy, one panel per distinct device program (devices with equal programs share it): the bytes held
after every event of the step stacked by kind, the phases shaded, the peak marked with what is alive there; the panel
of the device that limits the batch is titled in red.
"""
from __future__ import annotations

import html
import json
from typing import Any, Dict, List

from .tracker import MIB

__all__ = ["timeline_figure", "write_png", "timeline_html", "COLORS"]

#: One colour per kind (:data:`~encoding.memory.timeline.KINDS` order).
COLORS = {"parameters": "#4c72b0", "optimizer": "#8172b2", "gradients": "#dd8452", "activations": "#55a868",
          "outputs": "#c44e52", "communication": "#937860", "temporaries": "#bbbbbb"}
_PHASE_SHADE = {"forward": "#f2f2f2", "backward": "#ffffff", "gradients": "#f2f2f2", "optimizer": "#ffffff"}
#: Most points a PNG panel draws (every event beyond that is thinned, the peak kept).
_MAX_POINTS = 3000


def _stacks(entry: Dict[str, Any], kinds: List[str]) -> List[List[float]]:
    """MiB held by each kind after each event of one program's timeline (``as_dict`` form)."""
    level = [entry["start"].get(k, 0) for k in kinds]
    out: List[List[float]] = [[] for _ in kinds]
    for kind, delta in zip(entry["kind"], entry["delta"]):
        level[kind] += delta
        for k in range(len(kinds)):
            out[k].append(level[k] / MIB)
    return out


def _title(data: Dict[str, Any]) -> str:
    c = data["config"]
    parts = [f"{c['model']}-{c['backbone']}" if "model" in c else "", f"{c['nclass']} classes" if "nclass" in c
             else "", f"batch {c.get('batch_size')}", f"crop {c['crop_size']}" if "crop_size" in c else "",
             f"{c.get('devices')} device(s)"]
    return "memory of one training step per device: " + ", ".join(p for p in parts if p)


def _peak_note(entry: Dict[str, Any]) -> str:
    rows = [f"{r['bytes'] / MIB:.0f} MiB {r['kind']}: {r['made_by']}" for r in entry["largest"][:4]]
    return f"peak {entry['peak'] / MIB:.1f} MiB\n" + "\n".join(rows)


def timeline_figure(data: Dict[str, Any]) -> Any:
    """The timeline as a matplotlib figure (see the module's docstring)."""
    import matplotlib.pyplot as plt

    kinds, names = data["kinds"], data["kind_names"]
    strategies = list(data["strategies"])
    columns = max(len(data["strategies"][s]["programs"]) for s in strategies)
    fig, axes = plt.subplots(len(strategies), columns, figsize=(5.2 * columns, 3.4 * len(strategies)),
                             squeeze=False)
    limit = data["config"].get("memory_limit_mib")
    top = max([p["peak"] / MIB for s in strategies for p in data["strategies"][s]["programs"]] + [limit or 0]) * 1.08
    for row, strategy in enumerate(strategies):
        entry = data["strategies"][strategy]
        for col in range(columns):
            ax = axes[row][col]
            if col >= len(entry["programs"]):
                ax.axis("off")
                continue
            program = entry["programs"][col]
            _panel(ax, program, kinds, top)
            if limit:
                ax.axhline(limit, color="black", linestyle="--", linewidth=0.8, zorder=2)
                ax.text(0.99, limit, f"--memory-limit {data['config'].get('memory_limit')}", fontsize=6,
                        va="bottom", ha="right", transform=ax.get_yaxis_transform())
            limits = entry["limiting_device"] in program["devices"]
            ax.set_title(f"{strategy}: {program['label']}" + ("  (limits the batch)" if limits else ""),
                         fontsize=9, color="#b00000" if limits else "black")
            if col == 0:
                ax.set_ylabel("MiB")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    fig.legend(handles, [names[k] for k in kinds], loc="lower center", ncol=min(len(kinds), 4), fontsize=8)
    fig.suptitle(_title(data), fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    return fig


def _panel(ax: Any, program: Dict[str, Any], kinds: List[str], top: float) -> None:
    stacks = _stacks(program, kinds)
    count = len(program["delta"])
    step = max(1, count // _MAX_POINTS)
    xs = sorted(set(range(0, count, step)) | ({program["peak_event"]} if program["peak_event"] >= 0 else set()))
    for (phase, first), nxt in zip(program["phases"], program["phases"][1:] + [["", count]]):
        if nxt[1] > first:
            ax.axvspan(first, nxt[1], color=_PHASE_SHADE.get(phase, "#ffffff"), zorder=0)
            ax.text((first + nxt[1]) / 2, top * 0.985, phase, ha="center", va="top", fontsize=7, color="#555555")
    ax.stackplot(xs, [[s[x] for x in xs] for s in stacks], colors=[COLORS[k] for k in kinds], linewidth=0,
                 zorder=1)
    peak, at = program["peak"] / MIB, program["peak_event"]
    if at >= 0:
        ax.axvline(at, color="#b00000", linewidth=0.8, linestyle="--", zorder=2)
        left = 0.55 if at < count / 2 else 0.02  # the note beside the peak, not over it
        ax.annotate(_peak_note(program), (at, peak), xytext=(left, 0.9), textcoords="axes fraction", fontsize=6,
                    va="top", bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85}, zorder=3,
                    arrowprops={"arrowstyle": "->", "color": "#b00000", "linewidth": 0.6})
    ax.set_xlim(0, max(count - 1, 1))
    ax.set_ylim(0, top)
    ax.set_xlabel("event of the step", fontsize=8)
    ax.tick_params(labelsize=7)


def write_png(data: Dict[str, Any], path: str) -> str:
    """:func:`timeline_figure` as a PNG at ``path`` (atomically); ``""`` (and a hint) without matplotlib."""
    import sys

    from ..utils.curves import save_figure

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401 (installed: the timeline can be drawn)
    except ImportError:
        print("matplotlib is not installed, so no timeline.png was written; pip install matplotlib",
              file=sys.stderr)
        return ""
    return save_figure(timeline_figure(data), path)


def timeline_html(data: Dict[str, Any]) -> str:
    """The interactive page: pick a strategy and a device, hover for the event (phase, what made it, MiB by
    kind). Everything inline: the data as JSON, the drawing as JavaScript building SVG."""
    payload = json.dumps({"data": data, "colors": COLORS}).replace("</", "<\\/")
    return _PAGE.replace("__TITLE__", html.escape(_title(data))).replace("__DATA__", payload)


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>body{font:13px sans-serif;margin:16px}#tip{position:absolute;background:#fff;border:1px solid #999;
padding:4px 6px;font-size:12px;pointer-events:none;display:none;white-space:pre}.limit{color:#b00000}
svg{border:1px solid #ddd}</style></head><body>
<h3>__TITLE__</h3>
<label>strategy <select id="strategy"></select></label> <label>devices <select id="program"></select></label>
<span id="note"></span><div id="legend"></div><svg id="chart" width="960" height="420"></svg><div id="tip"></div>
<pre id="peak"></pre>
<script>
const P = __DATA__; const D = P.data, C = P.colors, K = D.kinds, MIB = 1048576;
const S = document.getElementById("strategy"), G = document.getElementById("program");
const svg = document.getElementById("chart"), tip = document.getElementById("tip");
const W = 960, H = 420, L = 60, R = 10, T = 24, B = 36;
for (const s in D.strategies) S.add(new Option(s, s));
document.getElementById("legend").innerHTML = K.map(k => '<span style="display:inline-block;width:12px;height:12px;' +
  'background:' + C[k] + '"></span> ' + D.kind_names[k]).join(" &nbsp; ");
function programs() { return D.strategies[S.value].programs; }
function fill() {
  G.innerHTML = ""; const e = D.strategies[S.value];
  programs().forEach((p, i) => G.add(new Option(p.label + (p.devices.includes(e.limiting_device) ?
    " (limits the batch)" : ""), i)));
  const lim = programs().findIndex(p => p.devices.includes(e.limiting_device)); G.value = Math.max(lim, 0); draw();
}
function stacks(p) {
  const lv = K.map(k => p.start[k] || 0), out = K.map(() => []);
  p.kind.forEach((k, i) => { lv[k] += p.delta[i]; K.forEach((_, j) => out[j].push(lv[j])); }); return out;
}
function el(n, a) { const e = document.createElementNS("http://www.w3.org/2000/svg", n);
  for (const k in a) e.setAttribute(k, a[k]); return e; }
function draw() {
  const e = D.strategies[S.value], p = programs()[G.value], st = stacks(p), n = p.delta.length;
  const lim = D.config.memory_limit_mib || 0;
  const top = Math.max(lim, ...D.strategies[S.value].programs.map(q => q.peak / MIB)) * 1.08;
  const x = i => L + (W - L - R) * i / Math.max(n - 1, 1), y = v => H - B - (H - T - B) * v / MIB / top;
  svg.innerHTML = ""; const base = new Array(n).fill(0);
  p.phases.forEach((ph, i) => { const end = i + 1 < p.phases.length ? p.phases[i + 1][1] : n;
    if (end > ph[1]) { svg.appendChild(el("rect", {x: x(ph[1]), y: T, width: x(end) - x(ph[1]), height: H - T - B,
      fill: i % 2 ? "#fff" : "#f2f2f2"})); const t = el("text", {x: (x(ph[1]) + x(end)) / 2, y: T - 6,
      "text-anchor": "middle", "font-size": 11}); t.textContent = ph[0]; svg.appendChild(t); } });
  K.forEach((k, j) => { let up = "", down = "";
    for (let i = 0; i < n; i++) { up += (i ? "L" : "M") + x(i) + "," + y(base[i] + st[j][i]); }
    for (let i = n - 1; i >= 0; i--) { down += "L" + x(i) + "," + y(base[i]); base[i] += st[j][i]; }
    svg.appendChild(el("path", {d: up + down + "Z", fill: C[k], stroke: "none"})); });
  for (let v = 0; v <= 4; v++) { const mib = top * v / 4, t = el("text", {x: L - 4, y: y(mib * MIB) + 4,
    "text-anchor": "end", "font-size": 10}); t.textContent = mib.toFixed(0); svg.appendChild(t); }
  const ax = el("text", {x: W / 2, y: H - 6, "text-anchor": "middle", "font-size": 11});
  ax.textContent = "event of the step (" + n + " events); MiB"; svg.appendChild(ax);
  if (lim) svg.appendChild(el("line", {x1: L, x2: W - R, y1: y(lim * MIB), y2: y(lim * MIB), stroke: "#000",
    "stroke-dasharray": "6,3"}));
  if (p.peak_event >= 0) svg.appendChild(el("line", {x1: x(p.peak_event), x2: x(p.peak_event), y1: T,
    y2: H - B, stroke: "#b00000", "stroke-dasharray": "4,3"}));
  const limits = p.devices.includes(e.limiting_device);
  document.getElementById("note").innerHTML = limits ? '<b class="limit">limits the batch</b>' : "";
  document.getElementById("peak").textContent = "peak " + (p.peak / MIB).toFixed(1) + " MiB at event " +
    p.peak_event + "; largest alive there:\\n" + p.largest.map(r => "  " + (r.bytes / MIB).toFixed(1) + " MiB  " +
    r.kind + "  " + r.made_by + "  (" + r.phase + ")").join("\\n");
  svg.onmousemove = ev => { const b = svg.getBoundingClientRect();
    const i = Math.round((ev.clientX - b.left - L) / (W - L - R) * (n - 1)); if (i < 0 || i >= n) return;
    const ph = p.phases.filter(q => q[1] <= i).pop(); let tot = 0; K.forEach((_, j) => tot += st[j][i]);
    tip.textContent = "event " + i + (ph ? " (" + ph[0] + ")" : "") + ": " + K[p.kind[i]] + " " +
      (p.delta[i] / MIB).toFixed(2) + " MiB by " + p.maker_names[p.maker[i]] + "\\ntotal " + (tot / MIB).toFixed(1) +
      " MiB\\n" + K.map((k, j) => "  " + D.kind_names[k] + ": " + (st[j][i] / MIB).toFixed(1)).join("\\n");
    tip.style.display = "block"; tip.style.left = (ev.pageX + 12) + "px"; tip.style.top = (ev.pageY + 12) + "px"; };
  svg.onmouseleave = () => { tip.style.display = "none"; };
}
S.onchange = fill; G.onchange = draw; fill();
</script></body></html>
"""
