"""quantities.py: one line per shared figure, and no two notebooks may print a figure differently."""

import json
import re
from pathlib import Path

import pytest

from m11_helpers import quantities as Q
from m11_helpers.activations import activation_bytes
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.model_states import LAYOUTS, gradient_bytes, model_state_bytes

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "course").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


def stored_outputs(path: Path) -> str:
    """Every stored output's text of a notebook (cleaned notebooks keep only the checked ones)."""
    out = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for o in cell.get("outputs", []):
            text = o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
            out.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(out)


def test_every_notebook_prints_the_current_value_and_notebooks_agree():
    assert NOTEBOOKS, "no notebooks found"
    outputs = {str(p.relative_to(ROOT)): stored_outputs(p) for p in NOTEBOOKS}
    problems = Q.check_outputs(outputs)
    assert not problems, "\n".join(problems)


def test_every_say_is_in_a_checked_cell():
    # a figure printed in an unchecked cell is stripped when the notebook is cleaned: nothing would guard it
    unguarded = []
    for path in NOTEBOOKS:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and re.search(r"\bsay\(", src) and not src.startswith("# NBVAL_CHECK_OUTPUT"):
                unguarded.append(f"{path.relative_to(ROOT)} cell {i}")
    assert not unguarded, f"say() outside a '# NBVAL_CHECK_OUTPUT' cell: {unguarded}"


def test_the_scan_catches_unknown_stale_and_disagreeing_lines():
    good = Q.line("7b.grad_bytes.autocast")
    stale = good.replace("27.0 GB", "13.5 GB")
    other = Q.line("7b.params", note="Touvron et al. 2023")
    assert Q.check_outputs({"a": f"intro\n{good}\n{other}", "b": "  " + good + "\n"}) == []
    problems = Q.check_outputs({"a": good, "b": stale, "c": "x [m11:7b.nope]"})
    assert len(problems) == 3
    assert "stale" in problems[0] and "b:" in problems[0]
    assert "a prints '27.0 GB', b prints '13.5 GB'" in problems[1]
    assert "unknown quantity [m11:7b.nope]" in problems[2]
    assert Q.check_outputs([("a", "M11-7B something else: 1 GB  [m11:7b.params]")])  # a changed label is stale too
    assert Q.find_tags("no tag here\n[m11:7b.params] not at the end") == []


def test_say_prints_the_canonical_line(capsys):
    out = Q.say("7b.params")
    assert capsys.readouterr().out == out + "\n"
    assert out == "M11-7B (Llama-2-7B shape) parameters: 6,738,415,616 parameters (6.74 B)  [m11:7b.params]"
    noted = Q.say("7b.grad_bytes.autocast", note="under autocast, no comm hook")
    assert noted.endswith("27.0 GB  (under autocast, no comm hook)  [m11:7b.grad_bytes.autocast]")
    with pytest.raises(ValueError, match="fmt keyword"):
        Q.say("7b.params", digits=3)
    with pytest.raises(ValueError, match="key"):
        Q.say("7b.parameters")


def test_values_come_from_the_owning_helpers():
    psi = param_count(RUNNING_EXAMPLE)
    assert Q.KEYS == tuple(Q.QUANTITIES) and len(set(Q.KEYS)) == len(Q.KEYS)
    assert Q.value("7b.params") == psi == 6_738_415_616
    for name in LAYOUTS:
        assert Q.value(f"7b.grad_bytes.{name}") == gradient_bytes(psi, name)
        assert Q.value(f"7b.model_states.{name}.zero3.n8") == model_state_bytes(psi, name, 8, 3)["total"]
    assert Q.value("7b.activations.full") == activation_bytes(RUNNING_EXAMPLE, 1, recompute="full")["total"]
    for key in Q.KEYS:  # every line renders, with its tag last
        assert Q.line(key).endswith(f"  [m11:{key}]") and Q.QUANTITIES[key].source
    # the figures the lessons used to disagree on: autocast moves fp32 gradients; one activation model
    shown = {k: Q.QUANTITIES[k].text() for k in Q.KEYS}
    assert shown["7b.grad_bytes.autocast"] == "27.0 GB" and shown["7b.grad_bytes.autocast+bf16-hook"] == "13.5 GB"
    assert shown["7b.model_states.deepspeed"] == "107.8 GB = 100.4 GiB"
    assert shown["7b.model_states.megatron"] == "121.3 GB = 113.0 GiB"
    assert shown["7b.model_states.deepspeed.zero1.n8"] == "37.1 GB = 34.5 GiB"
    assert shown["7b.bytes_per_param.autocast"].startswith("16 B/param (4 + 4 + 0 + 8")
    assert [shown[f"7b.activations.{k}"].split(" GB")[0] for k in ("none", "none.flash", "selective", "full")] == \
        ["55.1", "20.7", "20.7", "1.67"]


def test_format_gb_decimal_and_binary():
    assert Q.format_gb(27e9) == "27.0 GB"
    assert Q.format_gb(80 * 2**30, gib=True) == "85.9 GB = 80.0 GiB"  # an "80 GB" H100 holds 80 GiB
    assert Q.format_gb(1.665e9) == "1.67 GB"
    with pytest.raises(ValueError, match="n_bytes"):
        Q.format_gb(-1)


# ---------------------------------------------------------------- facts the prose names must be the helpers'

def _facts():
    from m11_helpers.cloud import NOTICES, PRICES
    from m11_helpers.hardware_specs import CHIPS
    # a chip is named by its row name, or by it without " SXM"/" (HGX)" unless that drops a capacity ("A100 SXM 80GB")
    aliases = {c.name: {c.name} | ({c.name.split(" (")[0].replace(" SXM", "")} if "GB" not in c.name else set())
               for c in CHIPS.values()}
    return CHIPS, aliases, {round(p.usd_per_hour, 2) for p in PRICES.values()}, NOTICES


_SENTENCE = re.compile(r"[^.\n]*(?:\n(?!\n)[^.\n]*)*")  # up to a full stop or a blank line
_LAYOUT_USE = re.compile(r"(?:bytes_per_param|model_state_bytes|gradient_bytes|as_layout)\([^)\"=]*\"([\w+\-]+)\""
                         r"|LAYOUTS\[\"([\w+\-]+)\"\]|(?:memory_per_gpu|memory_breakdown)\([^)]*layout=\"([\w+\-]+)\"")
_CHIP_USE = re.compile(r"(?:CHIPS\[|chip\()\"([^\"]+)\"")
_PROVIDERS = {"AWS": "AWS", "GCP": "Google Cloud", "Google": "Google Cloud", "Azure": "Azure"}


def fact_problems(texts: dict[str, str]) -> list[str]:
    """What a lesson's text states that the helpers do not hold: a layout or chip name, a chip's memory,
    a price, a preemption notice, or 2 + 2 + 4 + 8 called Megatron's."""
    chips, aliases, prices, notices = _facts()
    notice = {n.provider: n.seconds for n in notices}
    out = []
    for where, text in texts.items():
        for m in _LAYOUT_USE.finditer(text):
            name = next(g for g in m.groups() if g)
            if name not in LAYOUTS:
                out.append(f"{where}: layout {name!r} is not in model_states.LAYOUTS")
        for m in re.finditer(r"\$(\d+\.\d\d)\b", text):  # a full stop is part of a price: not per sentence
            if float(m.group(1)) not in prices:
                out.append(f"{where}: price ${m.group(1)} is in no cloud.PRICES row")
        for name in _CHIP_USE.findall(text):
            if name not in chips:
                out.append(f"{where}: chip {name!r} is not in hardware_specs.CHIPS")
        for sentence in text.splitlines() if where.endswith("(code)") else _SENTENCE.findall(text):
            if "Megatron" in sentence and re.search(r"2 \+ 2 \+ 4 \+ 8", sentence) and " not " not in sentence:
                out.append(f"{where}: calls 2 + 2 + 4 + 8 Megatron's: {sentence.strip()[:90]!r}")
            for name, names in aliases.items():
                for alias in names:
                    for m in re.finditer(rf"\b{re.escape(alias)}\b[^.\n]{{0,40}}?\b(\d+) GiB", sentence):
                        if int(m.group(1)) != round(chips[name].memory_gib):
                            out.append(f"{where}: {alias} with {m.group(1)} GiB; hardware_specs holds "
                                       f"{chips[name].memory_gib:g} GiB")
            for word, provider in _PROVIDERS.items():
                for m in re.finditer(rf"\b{word}\b[^;\n]{{0,60}}?\b(\d+)(-minute| ?s\b)", sentence):
                    got = int(m.group(1)) * (60 if m.group(2) == "-minute" else 1)
                    if "notice" in sentence.lower() and got != notice[provider]:
                        out.append(f"{where}: {word} notice {m.group(0)!r}; cloud.NOTICES holds {notice[provider]} s")
    return out


def _course_texts() -> dict[str, str]:
    texts = {}
    for path in NOTEBOOKS:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            texts[f"{path.relative_to(ROOT)} cell {i} ({cell['cell_type']})"] = "".join(cell["source"])
    for path in [*(ROOT / "m11_helpers" / "quizzes").glob("q*.py"), *(ROOT / "solutions" / "wrong_answers").glob("*.py")]:
        texts[f"{path.relative_to(ROOT)} (code)"] = path.read_text(encoding="utf-8")
    return texts


def test_lessons_name_only_the_layouts_chips_prices_and_notices_the_helpers_hold():
    problems = fact_problems(_course_texts())
    assert not problems, "\n".join(problems)
    planted = {"a": "Megatron-LM's bf16 default keeps 2 + 2 + 4 + 8 bytes per parameter.",
               "b (code)": 'states = bytes_per_param("megatron-fp32-grads")', "c (code)": 'CHIPS["H300"].peak_flops()',
               "d": "An MI300X holds 80 GiB of HBM.", "e": "A p5 node costs $55.04 per hour.",
               "f": "AWS sends a 5-minute interruption notice."}
    flagged = fact_problems(planted)
    assert sorted({p.split(":")[0] for p in flagged}) == sorted(planted), flagged  # each planted error is caught
