"""The reference pages keep up with the code: every setting and every stat is documented."""

from __future__ import annotations

import re

from helpers import ROOT

from scrapy_bloomdupe import settings

DOCS = ROOT / "docs"
PACKAGE = ROOT / "scrapy_bloomdupe"

#: A settings table row: | `NAME` | type | default | meaning |
SETTING_ROW = re.compile(r"^\| `(BLOOMDUPE_[A-Z_]+)` \|([^|]+)\|([^|]+)\|([^|]+)\|\s*$", re.M)
#: A stat name in the package's code, as a string literal ("bloomdupe/x" or f"bloomdupe/x/{y}").
STAT_LITERAL = re.compile(r"""f?["']((?:bloomdupe|scheduler)/[a-z_/]+(?:\{\w+\})?)["']""")


def documented_settings() -> dict[str, tuple[str, str, str]]:
    text = (DOCS / "settings.md").read_text()
    return {m[1]: (m[2].strip(), m[3].strip(), m[4].strip())
            for m in SETTING_ROW.finditer(text)}


def test_every_setting_is_documented_with_type_default_and_meaning() -> None:
    documented = documented_settings()
    assert set(documented) == set(settings.DEFAULTS), (
        "docs/settings.md and settings.DEFAULTS differ: "
        f"undocumented {sorted(set(settings.DEFAULTS) - set(documented))}, "
        f"documented but unknown {sorted(set(documented) - set(settings.DEFAULTS))}")
    for name, columns in documented.items():
        assert all(columns), f"{name}: a type, a default and a meaning in docs/settings.md"


def test_documented_defaults_are_the_code_defaults() -> None:
    for name, (_, default, _) in documented_settings().items():
        value = settings.DEFAULTS[name]
        shown = re.match(r"`([^`]*)`", default)
        assert shown, f"{name}: the default in backquotes in docs/settings.md"
        expected = repr(value) if isinstance(value, str) else str(value)
        assert shown[1].replace('"', "'") == expected.replace('"', "'"), (
            f"{name}: docs/settings.md says {shown[1]}, settings.DEFAULTS has {value!r}")


def code_stats() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for literal in STAT_LITERAL.findall(path.read_text()):
            names.add(re.sub(r"\{\w+\}", "<counter>", literal))
    return names


def test_every_stat_is_documented() -> None:
    stats_page = (DOCS / "stats.md").read_text()
    names = code_stats()
    assert "bloomdupe/checked" in names  # the pattern finds the package's stats
    missing = sorted(name for name in names if f"`{name}`" not in stats_page)
    assert not missing, f"stats set by the package but not in docs/stats.md: {missing}"
