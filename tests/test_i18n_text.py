"""The Chinese edition's text (dlcourse/i18n/zh/): the glossary's terms are the only ones used
and are used wherever the English has them; inline code, links, formulas and numbers are carried
over untouched; README.zh-CN.md's links resolve. Each check is shown to fail on a bad text."""

import re
from pathlib import Path

from dlcourse.i18n import catalog

COURSE = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- one term, one translation

GLOSSARY = Path(catalog.FOLDER) / "zh" / "glossary.md"


def glossary_rows():
    """(English, Chinese, [forbidden words], used everywhere) of every row of the table."""
    rows = [[cell.strip() for cell in line.split("|")[1:5]]
            for line in GLOSSARY.read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and not line.startswith("| English")]
    return [(en, zh, [w.strip() for w in words.split(",") if w.strip()], always == "yes")
            for en, zh, words, always in rows]


def forbidden_terms():
    """{forbidden word: (English term, the Chinese to write)} from the glossary's table."""
    return {word: (en, zh) for en, zh, words, _ in glossary_rows() for word in words}


def missing_terms(english, chinese):
    """The glossary's always-used terms that `english` has and `chinese` lacks."""
    missing = []
    for en, zh, _, always in glossary_rows():
        key = en.split("(")[0].strip()
        stem = key[:-1] if key.endswith("s") else key  # "gradients" also matches "gradient"
        if always and re.search(re.escape(stem), english, re.I) and zh not in chinese:
            missing.append(f"{key} -> {zh}")
    return missing


def glossary_breaches(text):
    return [f"{word!r} (write {zh} for {en})" for word, (en, zh) in forbidden_terms().items()
            if word in text]


def chinese_texts():
    """(where, text) of everything written in Chinese: catalogues and the README."""
    for po_path in sorted((catalog.FOLDER / "zh").glob("*/*.po")):
        for entry in catalog.load(po_path):
            if entry.msgstr:
                yield f"{po_path.name} {entry.msgctxt}", entry.msgstr
    yield "README.zh-CN.md", (COURSE / "README.zh-CN.md").read_text(encoding="utf-8")


def test_the_glossary_names_the_seed_terms():
    table = GLOSSARY.read_text(encoding="utf-8")
    for term in ["显存", "数据并行", "模型并行", "零冗余优化器", "广播", "规约", "参数", "梯度",
                 "优化器状态", "张量并行", "流水线并行", "序列并行", "激活重计算", "梯度累积",
                 "集合通信"]:
        assert f"| {term}" in table, term


def test_no_chinese_text_uses_a_term_the_glossary_rules_out():
    breaches = [f"{where}: {b}" for where, text in chinese_texts() for b in glossary_breaches(text)]
    assert not breaches, "\n".join(breaches)


def test_the_always_used_terms_are_used_wherever_the_english_has_them():
    breaches = [f"{where}: {m}" for where, english, chinese in _entries()
                for m in missing_terms(english, chinese)]
    assert not breaches, "\n".join(breaches)


def _entries():
    for po_path in sorted((catalog.FOLDER / "zh").glob("*/*.po")):
        for entry in catalog.load(po_path):
            if entry.msgstr and not entry.obsolete:
                where = f"{po_path.parent.name}/{po_path.name} {entry.msgctxt}"
                yield where, entry.msgid, entry.msgstr


def test_the_glossary_check_can_fail():
    assert missing_terms("Average the gradients over data parallel ranks.",
                         "在数据平行的各 rank 之间平均梯度。") == ["data parallel -> 数据并行"]
    assert glossary_breaches("用管道并行把各层分开，再做一次全规约") == [
        "'管道并行' (write 流水线并行 for pipeline parallel(ism))",
        "'全规约' (write 原文保留 (all-reduce) for all-reduce)"]


def test_the_readmes_link_each_other_and_every_link_of_the_chinese_one_resolves():
    english = (COURSE / "README.md").read_text(encoding="utf-8")
    chinese = (COURSE / "README.zh-CN.md").read_text(encoding="utf-8")
    assert "(README.zh-CN.md)" in english.split("\n## ")[0]  # at the top
    broken = [link for link in re.findall(r"\]\(([^)\s]+)\)", chinese)
              if not link.startswith("http") and not (COURSE / link.split("#")[0]).exists()]
    assert not broken, f"README.zh-CN.md: links that go nowhere: {broken}"
    for readme in (english, chinese):  # the CPU line names PyTorch's selector, not an index
        assert not re.search(r"--(extra-)?index-url\s+https?://", readme)


FENCE = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?!\n))+`")  # within one paragraph
UNTOUCHED = {"inline code": INLINE_CODE, "link": re.compile(r"\]\(([^)\s]+)"),
             "math": re.compile(r"\$[^$]+\$"), "code block": FENCE}


def untouched_breaches(english, chinese):
    """What a translation changed that it must carry over as it is: inline code, link targets,
    $math$ and fenced blocks (whitespace inside inline code normalised: a line break there is
    a space in markdown)."""
    def spans(rx, text):
        found = rx.findall(text if rx is FENCE else FENCE.sub("", text))
        return {re.sub(r"\s+", " ", s) if rx is INLINE_CODE else s for s in found}

    return [f"{kind} {sorted(spans(rx, english) ^ spans(rx, chinese))}"
            for kind, rx in UNTOUCHED.items() if spans(rx, english) != spans(rx, chinese)]


def test_code_identifiers_formulas_and_links_are_carried_over_untouched():
    breaches = [f"{po_path.parent.name}/{po_path.name} {entry.msgctxt}: {b}"
                for po_path in sorted((catalog.FOLDER / "zh").glob("*/*.po"))
                for entry in catalog.load(po_path) if entry.msgstr and not entry.obsolete
                for b in untouched_breaches(entry.msgid, entry.msgstr)]
    assert not breaches, "\n".join(breaches)


def test_the_untouched_check_can_fail():
    english = "Call `dist.all_reduce(t)`: see [ring](../dlcourse/collectives/ring.py), $2(n-1)/n$."
    chinese = "调用 `dist.all_reduce(x)`：见[环](../dlcourse/collectives/ring.py)，$2(n-1)/n$。"
    assert untouched_breaches(english, chinese) == [
        "inline code ['`dist.all_reduce(t)`', '`dist.all_reduce(x)`']"]


NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:e-?\d+)?")
# Said in words one way and in digits the other, so left out of the comparison: "7 billion" is
# 70 亿 in Chinese, "a gigabyte" 1 GB.
CONVERTED = {"en": re.compile(r"\d+(?:\.\d+)?(?=[- ](?:billion|million))"),
             "zh": re.compile(r"\d+(?:\.\d+)?(?= ?[亿万])|(?<![\d.])1(?= [GM]B)")}


def number_breaches(english, chinese):
    """The numbers of one text missing from the other (fenced blocks aside)."""
    def numbers(text, lang):
        text = CONVERTED[lang].sub("", FENCE.sub("", text))
        return set(NUMBER.findall(text))

    en, zh = numbers(english, "en"), numbers(chinese, "zh")
    return [f"{side} {sorted(found)}" for side, found in
            [("missing", en - zh), ("added", zh - en)] if found]


def test_every_number_is_carried_over():
    breaches = [f"{where}: {b}" for where, english, chinese in _entries()
                for b in number_breaches(english, chinese)]
    assert not breaches, "\n".join(breaches)


def test_the_number_check_can_fail():
    assert number_breaches("4 ranks send 6,291,456 bytes, 7 billion parameters",
                           "4 个 rank 发送 6,219,456 字节，70 亿参数") == [
        "missing ['6,291,456']", "added ['6,219,456']"]
