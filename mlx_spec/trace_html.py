"""A trace (trace.py) saved: as JSON, or as one self-contained HTML page — the answer in the
app's colours, the drafts the target threw away struck out before each correction, every
token's p, q and round on hover (or a tap), and the round timeline. No network: styles, script
and data are inline."""

from __future__ import annotations

import html
import json
from pathlib import Path

from .errors import MlxSpecError
from .trace import Trace, rejected_text, to_dict

# the app's default theme (Textual's textual-dark): KIND_STYLE in mlx_spec_app/widgets.py
COLOURS = {"accepted": "#4EBF71", "corrected": "#ba3c5b", "bonus": "#0178D4", "target": ""}

_STYLE = """
body { background: #1e1e1e; color: #e0e0e0; font: 14px/1.5 ui-monospace, Menlo, Consolas,
  monospace; margin: 1.5em auto; max-width: 60em; padding: 0 1em; }
h1 { font-size: 1.1em; margin: 0 0 .3em; } h2 { font-size: 1em; margin: 1.5em 0 .4em; }
.meta { color: #a0a0a0; } .meta b { color: #e0e0e0; font-weight: normal; }
.answer { white-space: pre-wrap; background: #121212; padding: .8em 1em; border-radius: 4px; }
.t { cursor: default; } .t:hover, .t.on { background: #333; }
.accepted { color: #4EBF71; } .corrected { color: #ba3c5b; font-weight: bold;
  text-decoration: underline; } .bonus { color: #0178D4; font-style: italic; }
.ghost { color: #777; text-decoration: line-through; opacity: .75; }
body.noghosts .ghost { display: none; }
.legend span { margin-right: 1.2em; } .user { color: #a0a0a0; white-space: pre-wrap; }
#tip { position: fixed; right: 1em; bottom: 1em; width: 26em; background: #2a2a2a;
  border: 1px solid #555; padding: .6em .8em; display: none; font-size: 13px; }
#tip table { border-collapse: collapse; } #tip td { padding: 0 .6em 0 0; }
table.rounds { border-collapse: collapse; font-size: 13px; }
table.rounds td, table.rounds th { padding: 1px .6em; text-align: right; }
table.rounds th { color: #a0a0a0; font-weight: normal; }
.bar { display: inline-block; height: .8em; vertical-align: middle; }
.bd { background: #0178D4; } .bv { background: #4EBF71; } .bc { background: #c08000; }
"""

# hover: the token's round and its row (p, q, the test, top-5s), from the embedded data
_SCRIPT = """(() => {
const T = JSON.parse(document.getElementById('trace').textContent);
const tip = document.getElementById('tip');
const pct = x => x === null || x === undefined ? '–' : (100 * x).toFixed(x < 0.001 ? 3 : 1) + '%';
const esc = s => s.replace(/[&<>]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'}[c]));
const shown = s => esc(JSON.stringify(s).slice(1, -1));
function top(list) {
  return list.map(c => '<tr><td>' + shown(c.text) + '</td><td>' + pct(c.prob) + '</td></tr>')
    .join('');
}
function show(el) {
  document.querySelectorAll('.t.on').forEach(e => e.classList.remove('on'));
  el.classList.add('on');
  const t = T.tokens[+el.dataset.i], r = T.rounds[t.round];
  let h = '<b>' + shown(t.text) + '</b> · ' + t.kind;
  if (!r) { tip.innerHTML = h + '<br>(not traced round by round)'; tip.style.display = 'block';
    return; }
  const pos = +el.dataset.pos, row = r.rows[pos];
  h += '<br>round ' + r.index + ': drafted ' + r.k + ', accepted ' + r.accepted +
    (r.copied ? ' (a copy)' : '') + ' · draft ' + (1e3 * r.draft_s).toFixed(1) +
    ' ms, verify ' + (1e3 * r.verify_s).toFixed(1) + ' ms, commit ' +
    (1e3 * r.commit_s).toFixed(1) + ' ms';
  if (row) {
    if (row.draft !== null) {
      h += '<br>draft ' + shown(row.draft_text) + ': p ' + pct(row.p) + ', q ' + pct(row.q);
      if (r.rule === 'p/q' && row.q) h += ', min(1, p/q) ' + pct(Math.min(1, row.p / row.q));
      if (r.rule === 'argmax') h += ' (greedy: kept if it is the target\\'s argmax)';
      h += ' → ' + row.verdict;
    }
    h += '<br>p(' + shown(row.token_text) + ') ' + pct(row.p_token);
    h += '<table><tr><td>top-5 p</td><td></td></tr>' + top(row.top_p) + '</table>';
    if (row.top_q.length) h += '<table><tr><td>top-5 q</td><td></td></tr>' +
      top(row.top_q) + '</table>';
    const lost = r.rows.filter(x => x.verdict === 'rejected' || x.verdict === 'untested');
    if (t.kind === 'corrected' && lost.length) h += 'rejected: ' + lost.map(x =>
      shown(x.draft_text) + ' (p ' + pct(x.p) + ', q ' + pct(x.q) + ')').join(', ');
  } else {
    h += '<br>a plain step: the target\\'s own token (its probabilities are not read)';
  }
  tip.innerHTML = h; tip.style.display = 'block';
}
document.querySelectorAll('.t').forEach(el => {
  el.addEventListener('mouseenter', () => show(el));
  el.addEventListener('click', () => show(el));
});
const at = /^#t=(\\d+)$/.exec(location.hash);  // a link to one token: page.html#t=12
if (at && document.querySelector('.t[data-i="' + at[1] + '"]'))
  show(document.querySelector('.t[data-i="' + at[1] + '"]'));
document.getElementById('ghosts').addEventListener('change',
  e => document.body.classList.toggle('noghosts', !e.target.checked));
})();
"""


def render(trace: Trace) -> str:
    """The whole page."""
    data = json.dumps(to_dict(trace), ensure_ascii=False).replace("</", "<\\/")
    return "".join([
        "<!doctype html><html><head><meta charset='utf-8'><title>mlx-spec trace</title>",
        f"<style>{_STYLE}</style></head><body>",
        _header(trace),
        "".join(f"<p class='user'>{html.escape(str(m.get('role', '')))}: "
                f"{html.escape(_said(m.get('content')))}</p>" for m in trace.messages),
        "<div class='answer'>", _answer(trace), "</div>",
        _timeline(trace),
        "<div id='tip'></div>",
        f"<script type='application/json' id='trace'>{data}</script>",
        f"<script>{_SCRIPT}</script></body></html>",
    ])


def _said(content: object) -> str:
    """A message's content: text, or (OpenAI's content parts) their text joined."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _header(trace: Trace) -> str:
    s, e, sm = trace.stats, trace.engine, trace.sampling
    parts = [f"{k} <b>{html.escape(str(v))}</b>" for k, v in e.items() if v not in ("", None)]
    temp = sm.get("temperature", 0)
    parts.append("greedy" if not temp else f"T <b>{temp}</b>"
                 + (f" · seed <b>{sm['seed']}</b>" if sm.get("seed") is not None else ""))
    line2 = ""
    if s is not None:
        line2 = (f"<b>{s.generated_tokens}</b> tokens · <b>{s.tok_s:.1f}</b> tok/s · "
                 f"acceptance <b>{100 * s.acceptance_rate:.0f}%</b> · "
                 f"<b>{s.tokens_per_pass:.2f}</b> tokens per target pass · "
                 f"<b>{s.target_passes}</b> passes · finish <b>{s.finish_reason}</b>")
    legend = "".join(f"<span class='{k}'>■ {k}</span>" for k in COLOURS)
    return (f"<h1>mlx-spec trace</h1><div class='meta'>{' · '.join(parts)}<br>{line2}<br>"
            f"<span class='legend'>{legend}<span class='ghost'>rejected draft</span></span>"
            "<label><input type='checkbox' id='ghosts' checked> show rejected drafts</label> · "
            "hover a token for p, q and its round (#t=N in the address: token N)"
            f"{' · ' + html.escape(trace.created) if trace.created else ''}</div>")


def _answer(trace: Trace) -> str:
    """Token spans (data-i: the token, data-pos: its row in its round), and before each
    correction its round's rejected drafts as ghost text."""
    out: list[str] = []
    first_of: dict[int, int] = {}  # round -> index of its first token
    for i, t in enumerate(trace.tokens):
        pos = i - first_of.setdefault(t.round, i)
        if t.kind == "corrected" and 0 <= t.round < len(trace.rounds):
            lost = rejected_text(trace.rounds[t.round])
            if lost:  # struck out before the target's token, as an edit is marked
                out.append(f"<span class='ghost'>{html.escape(lost)}</span>")
        out.append(f"<span class='t {t.kind}' data-i='{i}' data-pos='{pos}'>"
                   f"{html.escape(t.text)}</span>")
    return "".join(out)



def _timeline(trace: Trace) -> str:
    """One row per round: drafted, accepted, emitted, and its time split as bars."""
    if not trace.rounds:
        return ""
    longest = max(r.draft_s + r.verify_s + r.commit_s for r in trace.rounds) or 1.0
    rows = []
    for r in trace.rounds:
        bars = "".join(f"<span class='bar {c}' style='width:{12 * s / longest:.2f}em'></span>"
                       for c, s in (("bd", r.draft_s), ("bv", r.verify_s), ("bc", r.commit_s)))
        ms = 1e3 * (r.draft_s + r.verify_s + r.commit_s)
        rows.append(f"<tr><td>{r.index}</td><td>{1e3 * r.at_s:.0f}</td><td>{r.k}</td>"
                    f"<td>{r.accepted}</td><td>{r.emitted}</td>"
                    f"<td>{'copy' if r.copied else ''}</td><td>{ms:.1f}</td>"
                    f"<td style='text-align:left'>{bars}</td></tr>")
    return ("<h2>Rounds</h2><table class='rounds'><tr><th>#</th><th>at ms</th><th>drafted</th>"
            "<th>accepted</th><th>emitted</th><th></th><th>ms</th><th style='text-align:left'>"
            "<span class='bar bd' style='width:.8em'></span> draft "
            "<span class='bar bv' style='width:.8em'></span> verify "
            "<span class='bar bc' style='width:.8em'></span> commit</th></tr>"
            + "".join(rows) + "</table>")


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write the trace: HTML for a .html / .htm path (one self-contained page), else JSON."""
    path = Path(path).expanduser()
    if path.suffix.lower() in (".html", ".htm"):
        text = render(trace)
    else:
        text = json.dumps(to_dict(trace), ensure_ascii=False, indent=1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise MlxSpecError(f"cannot write the trace to {path}: {e.strerror or e}") from e
    return path
