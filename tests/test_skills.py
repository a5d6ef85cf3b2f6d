"""Skills: catalog rules (override, enable/disable, malformed files), what the model is shown, and
loading a skill's body in a real turn (the model faked over HTTP, the tools real).

The shipped skills' helper scripts are run as the agent would run them: as programs, on files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent, Final, ToolProgress
from agent.harness import Harness
from agent.skills import SkillCatalog, SkillsSettings, build_skills
from agent.skills_prompt import SkillsListing, load_skill_text
from tests.daemon import REPO
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

PUBLIC = REPO / "skills" / "public"
HAVE_BWRAP = shutil.which("bwrap") is not None


def write_skill(root: Path, name: str, description: str, body: str, **front: Any) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"name": name, "description": description, **front}
    lines = ["---", *(f"{k}: {json.dumps(v)}" for k, v in meta.items()), "---", "", body, ""]
    (folder / "SKILL.md").write_text("\n".join(lines), encoding="utf-8")
    return folder


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """public: alpha, beta, gamma; custom: beta (override), delta."""
    public, custom = tmp_path / "public", tmp_path / "custom"
    write_skill(
        public,
        "alpha",
        "Alpha does A things.",
        "ALPHA-BODY-MARKER: step one.",
        **{"allowed-tools": "web_search web_fetch"},
    )
    beta = write_skill(public, "beta", "Public beta.", "PUBLIC-BETA-BODY")
    (beta / "old.txt").write_text("public file")
    write_skill(public, "gamma", "Gamma is disabled in the tests.", "GAMMA-BODY-MARKER")
    beta2 = write_skill(
        custom,
        "beta",
        "Custom beta for house style.",
        "CUSTOM-BETA-BODY: use the house style.",
        license="MIT",
        version=2,
    )
    (beta2 / "reference.md").write_text("REFERENCE-CONTENT\n")
    (beta2 / "scripts").mkdir()
    (beta2 / "scripts" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(beta2 / "scripts" / "run.sh", 0o700)
    write_skill(custom, "delta", "Delta helps with D.", "DELTA-BODY-MARKER")
    return public, custom


def settings(dirs: tuple[Path, Path], **kw: Any) -> SkillsSettings:
    return SkillsSettings(public_dir=dirs[0], custom_dir=dirs[1], **kw)


# ---- catalog ---------------------------------------------------------------------------------------


def test_catalog_merges_public_and_custom_with_override(dirs: tuple[Path, Path]) -> None:
    catalog = SkillCatalog(settings(dirs))
    assert catalog.names == ["alpha", "beta", "delta", "gamma"]
    beta = catalog.get("beta")
    assert beta is not None and beta.source == "custom"
    assert beta.description == "Custom beta for house style." and beta.body.startswith("CUSTOM-BETA-BODY")
    assert (beta.license, beta.version) == ("MIT", "2")
    assert beta.files == ("reference.md", "scripts/run.sh")
    assert catalog.get("alpha").allowed_tools == ("web_search", "web_fetch")  # type: ignore[union-attr]


def test_enabled_and_disabled(dirs: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agent.skills")
    assert SkillCatalog(settings(dirs, disabled=["gamma"])).names == ["alpha", "beta", "delta"]
    only = SkillCatalog(settings(dirs, enabled=["alpha", "beta", "nosuch"], disabled=["beta"]))
    assert only.names == ["alpha"]  # disabled wins over enabled
    assert "skills.enabled names nosuch" in caplog.text


MALFORMED = {
    "no-front-matter": ("# Just a heading\n\nNo front matter.\n", "no YAML front matter"),
    "bad-yaml": ("---\nname: bad-yaml\ndescription: [unclosed\n---\n\nBody.\n", "invalid YAML front matter"),
    "wrong-name": ("---\nname: other-name\ndescription: d\n---\n\nBody.\n", "does not match its folder name"),
    "no-description": ("---\nname: no-description\n---\n\nBody.\n", "has no 'description'"),
    "Bad_Name": ("---\nname: Bad_Name\ndescription: d\n---\n\nBody.\n", "is not valid"),
    "empty-body": ("---\nname: empty-body\ndescription: d\n---\n\n   \n", "no instructions"),
    "bad-tools": (
        "---\nname: bad-tools\ndescription: d\nallowed-tools: {a: 1}\n---\n\nBody.\n",
        "'allowed-tools'",
    ),
    "not-a-mapping": ("---\n- a\n- b\n---\n\nBody.\n", "not a mapping"),
    "long-description": (
        f"---\nname: long-description\ndescription: {'x' * 1100}\n---\n\nB.\n",
        "the limit is 1024",
    ),
}


def test_malformed_skills_are_skipped_with_a_warning(
    dirs: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _public, custom = dirs
    for name, (text, _) in MALFORMED.items():
        (custom / name).mkdir()
        (custom / name / "SKILL.md").write_text(text, encoding="utf-8")
    (custom / "not-utf8").mkdir()
    (custom / "not-utf8" / "SKILL.md").write_bytes(b"---\nname: not-utf8\ndescription: \xff\xfe\n---\nB\n")
    (custom / "no-skill-file").mkdir()
    (custom / "no-skill-file" / "skill.md").write_text("lowercase file name")
    caplog.set_level(logging.WARNING, "agent.skills")

    catalog = SkillCatalog(settings(dirs))  # must not raise

    assert catalog.names == ["alpha", "beta", "delta", "gamma"]
    for name, (_, problem) in MALFORMED.items():
        lines = [r.getMessage() for r in caplog.records if str(custom / name / "SKILL.md") in r.getMessage()]
        assert lines and problem in lines[0], (name, lines)
    assert "not UTF-8" in caplog.text
    assert f"{custom / 'no-skill-file'} has no SKILL.md" in caplog.text


def test_missing_folders_give_an_empty_catalog(tmp_path: Path) -> None:
    tools, middleware, catalog = build_skills(
        SkillsSettings(public_dir=tmp_path / "x", custom_dir=tmp_path / "y")
    )
    assert len(catalog) == 0 and [t.name for t in tools] == ["load_skill"] and len(middleware) == 1


def test_load_skill_text_and_supporting_files(dirs: tuple[Path, Path]) -> None:
    catalog = SkillCatalog(settings(dirs, disabled=["gamma"]))
    text = load_skill_text(catalog, "beta")
    assert "CUSTOM-BETA-BODY" in text and "PUBLIC-BETA-BODY" not in text
    assert "/mnt/skills/beta/" in text and "reference.md" in text and "name:" not in text
    assert load_skill_text(catalog, "beta", "reference.md") == "REFERENCE-CONTENT\n"
    assert "scripts/run.sh" in load_skill_text(catalog, "beta", ".")
    from langchain_core.tools import ToolException

    for name, file, expected in [
        ("gamma", None, "no skill named 'gamma'"),
        ("beta", "../../alpha/SKILL.md", "outside the skill's folder"),
        ("beta", "/etc/passwd", "no file"),
        ("beta", "old.txt", "no file"),  # the public beta's file is not part of the custom beta
    ]:
        with pytest.raises(ToolException) as exc:
            load_skill_text(catalog, name, file)
        assert expected.lower() in str(exc.value).lower(), (name, file, str(exc.value))


def test_listing_follows_reload(dirs: tuple[Path, Path]) -> None:
    _public, custom = dirs
    catalog = SkillCatalog(settings(dirs))
    listing = SkillsListing(catalog)
    before = listing.section(file_tool=False)
    assert "**epsilon**" not in before and listing.section(file_tool=False) is before  # cached
    write_skill(custom, "epsilon", "Epsilon arrived later.", "EPSILON-BODY")
    catalog.reload()
    assert "**epsilon**: Epsilon arrived later." in listing.section(file_tool=False)


def test_sandbox_view_holds_the_offered_skills(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    _public, custom = dirs
    (custom / "delta" / "leak").symlink_to("/etc/passwd")
    catalog = SkillCatalog(settings(dirs, disabled=["gamma"]))
    view = catalog.skills_dir_for_sandbox(tmp_path / "cache")
    assert view == (tmp_path / "cache" / "skills-view").resolve()
    assert sorted(p.name for p in view.iterdir()) == [".chital-skills-view", "alpha", "beta", "delta"]
    assert "CUSTOM-BETA-BODY" in (view / "beta" / "SKILL.md").read_text()
    assert not (view / "beta" / "old.txt").exists()
    assert not (view / "delta" / "leak").exists()  # symlinks never reach the sandbox
    assert os.stat(view / "beta" / "scripts" / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(view / "beta" / "reference.md").st_mode & 0o777 == 0o644

    inode = view.stat().st_ino
    write_skill(custom, "epsilon", "New one.", "EPSILON-BODY")
    shutil.rmtree(custom / "delta")
    catalog.reload()
    assert view.stat().st_ino == inode  # a running container's bind mount stays valid
    assert sorted(p.name for p in view.iterdir()) == [".chital-skills-view", "alpha", "beta", "epsilon"]

    # Never manages (and so never empties) a folder it did not make, nor the skill sources.
    foreign = tmp_path / "other" / "skills-view"
    foreign.mkdir(parents=True)
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not made by Chital"):
        catalog.skills_dir_for_sandbox(tmp_path / "other")
    assert (foreign / "precious.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="must not overlap"):
        catalog.skills_dir_for_sandbox(custom)


def test_shipped_public_skills_are_valid(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agent.skills")
    # An empty custom folder: one the settings name but that is missing is itself a warning.
    catalog = SkillCatalog(SkillsSettings(public_dir=PUBLIC, custom_dir=tmp_path))
    assert {"deep-research", "data-analysis", "report-writing"} <= set(catalog.names)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for skill in catalog.skills:
        assert 100 <= len(skill.description) <= 1024 and skill.license and skill.version
        assert len(skill.body) > 2000
    assert "scripts/profile_table.py" in catalog.get("data-analysis").files  # type: ignore[union-attr]
    assert "present_files" in catalog.get("report-writing").body  # type: ignore[union-attr]
    assert "task" in catalog.get("deep-research").allowed_tools  # type: ignore[union-attr]


# ---- real turns ------------------------------------------------------------------------------------


async def run_turn(
    tmp_path: Path, fake: FakeOpenAI, tools: Sequence[Any], middleware: Sequence[Any], text: str = "hello"
) -> list[AgentEvent]:
    spec = ModelSpec(base_url=fake.base_url, api_key="test-key", model="fake-model")
    harness = Harness(
        AgentSettings(model_retries=0),
        spec,
        tmp_path / "checkpoints.sqlite",
        extra_tools=tools,
        extra_middleware=middleware,
    )
    async with harness:
        async with aclosing(harness.run("t1", user_id="u1", message_id="m1", text=text)) as stream:
            return [event async for event in stream]


def system_prompt(request: dict[str, Any]) -> str:
    first = request["messages"][0]
    assert first["role"] == "system"
    content = first["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def tool_results(request: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in request["messages"] if m["role"] == "tool"]


async def test_prompt_lists_names_and_descriptions_not_bodies(
    dirs: tuple[Path, Path], tmp_path: Path, fake: FakeOpenAI
) -> None:
    tools, middleware, _ = build_skills(settings(dirs, disabled=["gamma"]))
    fake.script(Reply(text="hi there"))
    events = await run_turn(tmp_path, fake, tools, middleware)
    assert events[-1] == Final("hi there")
    prompt = system_prompt(fake.requests[0])
    assert prompt.startswith(AgentSettings().system_prompt)  # appended, never replacing it
    for name, description in [
        ("alpha", "Alpha does A things."),
        ("beta", "Custom beta for house style."),
        ("delta", "Delta helps with D."),
    ]:
        assert f"**{name}**: {description}" in prompt
    assert "Uses tools: web_search, web_fetch" in prompt
    for hidden in (
        "ALPHA-BODY-MARKER",
        "CUSTOM-BETA-BODY",
        "DELTA-BODY-MARKER",
        "Public beta",
        "gamma",
        "Gamma is disabled",
        "GAMMA-BODY-MARKER",
    ):
        assert hidden not in prompt
    assert "load_skill" in prompt and "/mnt/skills/" not in prompt  # no file tool: no paths
    assert [t["function"]["name"] for t in fake.requests[0]["tools"]] == ["load_skill"]


async def test_empty_catalog_adds_nothing(tmp_path: Path, fake: FakeOpenAI) -> None:
    tools, middleware, _ = build_skills(SkillsSettings(public_dir=tmp_path / "x", custom_dir=tmp_path / "y"))
    fake.script(Reply(text="ok"))
    await run_turn(tmp_path, fake, tools, middleware)
    assert system_prompt(fake.requests[0]) == AgentSettings().system_prompt
    assert not fake.requests[0].get("tools")


async def test_turn_loads_a_skill_body_with_load_skill(
    dirs: tuple[Path, Path], tmp_path: Path, fake: FakeOpenAI
) -> None:
    tools, middleware, _ = build_skills(settings(dirs))
    fake.script(
        Reply(tool_calls=[ToolCall("load_skill", {"name": "beta"})]),
        Reply(tool_calls=[ToolCall("load_skill", {"name": "nosuch"})]),
        Reply(text="Done, following the house style."),
    )
    events = await run_turn(tmp_path, fake, tools, middleware, "write it in house style")
    assert ToolProgress("load_skill", "start", '{"name": "beta"}') in events
    assert ToolProgress("load_skill", "error") in events
    assert events[-1] == Final("Done, following the house style.")
    assert len(fake.requests) == 3
    # The body reaches the model only after it asked for it, and it is the custom override's.
    assert all("CUSTOM-BETA-BODY" not in json.dumps(m) for m in fake.requests[0]["messages"])
    [body] = tool_results(fake.requests[1])
    assert "CUSTOM-BETA-BODY: use the house style." in body and "PUBLIC-BETA-BODY" not in body
    assert "There is no skill named 'nosuch'" in tool_results(fake.requests[2])[1]
    # The listing is byte-identical on every call of the turn (prompt caches stay warm).
    assert len({system_prompt(r) for r in fake.requests}) == 1


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """Outside pytest's private tmp dir: the sandbox uid must reach it when the tests run as root."""
    d = Path(tempfile.mkdtemp(prefix="chital-skills-test-"))
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed")
@pytest.mark.bwrap
async def test_turn_reads_the_body_and_runs_a_script_in_the_sandbox(
    sandbox_root: Path, fake: FakeOpenAI
) -> None:
    """Real sandbox: the view mounted read-only at /mnt/skills, deepagents' read_file and execute."""
    from deepagents.middleware.filesystem import FilesystemMiddleware

    from agent.sandbox.backend import SandboxBackend
    from agent.sandbox.local import LocalProvider

    tmp_path = sandbox_root
    custom = tmp_path / "custom"
    write_skill(custom, "data-analysis", "Custom analysis rules.", "CUSTOM-ANALYSIS-BODY")
    shutil.copytree(PUBLIC / "data-analysis" / "scripts", custom / "data-analysis" / "scripts")
    tools, middleware, catalog = build_skills(SkillsSettings(public_dir=PUBLIC, custom_dir=custom))
    provider = LocalProvider(tmp_path / "sbx", catalog.skills_dir_for_sandbox(tmp_path / "cache"))
    await provider.reconcile()
    try:
        sandbox = await provider.acquire("t1")
        (sandbox.dirs.uploads / "sales.csv").write_text("region,revenue\nNorth,10\nSouth,32\nNorth,5\n")
        fs = FilesystemMiddleware(backend=SandboxBackend(sandbox), tools=["ls", "read_file", "execute"])
        script = "/mnt/skills/data-analysis/scripts/profile_table.py"
        fake.script(
            Reply(
                tool_calls=[
                    ToolCall("read_file", {"file_path": "/mnt/skills/data-analysis/SKILL.md", "limit": 1000})
                ]
            ),
            Reply(
                tool_calls=[
                    ToolCall("execute", {"command": f"python3 {script} /mnt/user-data/uploads/sales.csv"})
                ]
            ),
            Reply(
                tool_calls=[ToolCall("execute", {"command": "echo x > /mnt/skills/data-analysis/SKILL.md"})]
            ),
            Reply(text="Revenue: North 15, South 32."),
        )
        events = await run_turn(tmp_path, fake, tools, [fs, *middleware], "analyse my sales")
    finally:
        await provider.close()
    assert events[-1] == Final("Revenue: North 15, South 32.")
    prompt = system_prompt(fake.requests[0])
    assert "`/mnt/skills/data-analysis/SKILL.md`" in prompt and "read_file" in prompt
    assert "`/mnt/skills/report-writing/SKILL.md`" in prompt and "CUSTOM-ANALYSIS-BODY" not in prompt
    [read] = tool_results(fake.requests[1])
    assert "CUSTOM-ANALYSIS-BODY" in read
    profile_out = tool_results(fake.requests[2])[1]
    assert "| revenue | integer | 0 | 3 | min 5, median 10" in profile_out, profile_out
    write_out = tool_results(fake.requests[3])[2]
    assert "Read-only file system" in write_out or "Permission denied" in write_out
    assert (
        "CUSTOM-ANALYSIS-BODY"
        in (tmp_path / "cache" / "skills-view" / "data-analysis" / "SKILL.md").read_text()
    )


# ---- the shipped helper scripts --------------------------------------------------------------------

DA = PUBLIC / "data-analysis" / "scripts"
RW = PUBLIC / "report-writing" / "scripts"


def run_script(script: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-B", str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "data"
    d.mkdir()
    (d / "sales.csv").write_text(
        "date;region;units;revenue;note\n"
        "2024-01-03;North;12;1,200.50;ok\n"
        "2024-01-04;South;7;€800;café\n"
        "2024-01-05;North;n/a;950; spaced\n"
        "2024-01-05;North;n/a;950; spaced\n"
        "2024-02-10;East;30;3000.25;ok\n",
        encoding="cp1252",
    )
    records = [{"id": 1, "ok": True, "tags": ["a"]}, {"id": 2, "ok": False, "extra": None}]
    (d / "records.json").write_text(json.dumps({"meta": {}, "data": records}))
    (d / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    _write_xlsx(d / "book.xlsx")
    yield d


def _write_xlsx(path: Path) -> None:
    """A minimal two-sheet .xlsx as Excel writes it: shared strings, sparse cells, a boolean."""
    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    rns = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            "xl/workbook.xml",
            f'<workbook {ns} {rns}><sheets><sheet name="Notes" sheetId="1" r:id="rId1"/>'
            f'<sheet name="Orders" sheetId="2" r:id="rId2"/></sheets></workbook>',
        )
        zf.writestr(
            "xl/_rels/workbook.xml.rels",
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Target="worksheets/sheet1.xml"/>'
            '<Relationship Id="rId2" Target="/xl/worksheets/sheet2.xml"/></Relationships>',
        )
        zf.writestr(
            "xl/sharedStrings.xml",
            f"<sst {ns}><si><t>product</t></si><si><t>qty</t></si>"
            f"<si><r><t>Wid</t></r><r><t>get</t></r></si><si><t>paid</t></si></sst>",
        )
        zf.writestr("xl/worksheets/sheet1.xml", f"<worksheet {ns}><sheetData/></worksheet>")
        zf.writestr(
            "xl/worksheets/sheet2.xml",
            f"<worksheet {ns}><sheetData>"
            '<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c><c r="D1" t="s"><v>3</v></c></row>'
            '<row r="2"><c r="A2" t="s"><v>2</v></c><c r="B2"><v>3</v></c><c r="D2" t="b"><v>1</v></c></row>'
            '<row r="3"><c r="A3" t="inlineStr"><is><t>Gadget</t></is></c><c r="B3"><v>4.5</v></c></row>'
            "</sheetData></worksheet>",
        )


def test_profile_table_reports_types_and_problems(data_dir: Path) -> None:
    res = run_script(DA / "profile_table.py", data_dir / "sales.csv")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "encoding: 'cp1252', delimiter: ';'" in out and "rows: 5, columns: 5" in out
    assert "| date | date | 0 | 4 | 2024-01-03 → 2024-02-10 |" in out
    assert "| units | integer | 2 | 3 | min 7, median 12" in out
    assert "| revenue | number | 0 | 4 | min 800" in out and "max 3000.25" in out
    assert "1 row(s) are exact duplicates" in out
    assert "column 'revenue': some values carry thousands separators, currency or % signs" in out
    assert "column 'note': some values have leading/trailing spaces" in out

    as_json = json.loads(run_script(DA / "profile_table.py", data_dir / "records.json", "--json").stdout)
    assert as_json["records_key"] == "data" and as_json["rows"] == 2
    assert [c["name"] for c in as_json["columns"]] == ["id", "ok", "tags", "extra"]
    assert [c["type"] for c in as_json["columns"]] == ["integer", "boolean", "text", "empty"]
    jsonl = json.loads(run_script(DA / "profile_table.py", data_dir / "records.jsonl", "--json").stdout)
    assert jsonl["format"] == "jsonl" and jsonl["rows"] == 2

    xlsx = json.loads(
        run_script(DA / "profile_table.py", data_dir / "book.xlsx", "--sheet", "Orders", "--json").stdout
    )
    assert xlsx["sheets"] == ["Notes", "Orders"] and xlsx["rows"] == 2
    cols = {c["name"]: c for c in xlsx["columns"]}
    assert list(cols) == ["product", "qty", "column_3", "paid"]
    assert cols["product"]["top"] == [["Widget", 1], ["Gadget", 1]] and cols["qty"]["max"] == 4.5

    missing = run_script(DA / "profile_table.py", data_dir / "book.xlsx", "--sheet", "Nope")
    assert missing.returncode == 2 and "no sheet named 'Nope'; sheets: Notes, Orders" in missing.stderr


def test_chart_writes_valid_svg_and_prints_the_numbers(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "by_region.svg"
    res = run_script(
        DA / "chart.py",
        "bar",
        data_dir / "sales.csv",
        "--x",
        "region",
        "--y",
        "revenue",
        "--title",
        "Revenue by region",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    assert "| North | 3100.5 |\n| East | 3000.25 |\n| South | 800 |" in res.stdout  # sorted by value
    svg = ElementTree.parse(out).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text for t in svg.iter(f"{ns}title")]
    assert titles == ["North: 3100", "East: 3000", "South: 800"]
    assert "Revenue by region" in [t.text for t in svg.iter(f"{ns}text")]

    for args in (
        ["line", "--x", "date", "--y", "revenue", "--y", "units"],
        ["hist", "--x", "revenue", "--bins", "4"],
        ["scatter", "--x", "units", "--y", "revenue"],
        ["hbar", "--x", "region"],
    ):
        target = tmp_path / f"{args[0]}.svg"
        res = run_script(DA / "chart.py", args[0], data_dir / "sales.csv", *args[1:], "--out", target)
        assert res.returncode == 0, (args, res.stderr)
        ElementTree.parse(target)  # well-formed
    bad = run_script(
        DA / "chart.py", "bar", data_dir / "sales.csv", "--x", "nope", "--out", tmp_path / "x.svg"
    )
    assert bad.returncode == 2 and "no column 'nope'; columns: date, region" in bad.stderr


def test_check_report_flags_template_leftovers_and_passes_a_clean_report(tmp_path: Path) -> None:
    template = PUBLIC / "report-writing" / "templates" / "report.md"
    res = run_script(RW / "check_report.py", template)
    assert res.returncode == 1 and "placeholder left in: '<date>'" in res.stdout

    (tmp_path / "chart.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    good = tmp_path / "q3-churn.md"
    good.write_text(
        "# Q3 churn rose 4 points\n\n*Prepared by Chital, 2025-10-01*\n\n## Summary\n\n"
        "Churn rose from 3.1% to 7.2% [1], mostly in March [1, 2]. See [findings](#findings).\n\n"
        "## Findings\n\n![Churn by month](chart.png)\n\n| month | churn |\n|---|---|\n| Jul | 3.1% |\n\n"
        "Code stays literal: `<not a placeholder>`.\n\n## Sources\n\n"
        "[1] Billing export — internal, 2025-09-30 — https://example.com/billing\n"
        "[2] Support tickets — internal, 2025-09-30 — https://example.com/tickets\n"
    )
    res = run_script(RW / "check_report.py", good)
    assert res.returncode == 0 and "OK: no problems found" in res.stdout, res.stdout

    bad = tmp_path / "bad.md"
    bad.write_text(
        "## Intro\n\nClaim [3]. TODO later.\n\n#### Deep\n\n## Sources\n\n[1] A — b — https://a\n\n"
        "![x](missing.png)\n\n```\nunclosed\n"
    )
    out = run_script(RW / "check_report.py", bad).stdout
    for expected in (
        "no '# Title' heading",
        "citation [3] has no entry",
        "placeholder left in: 'TODO'",
        "image target does not exist: missing.png",
        "never closed",
        "source [1] is listed but never cited",
        "heading level jumps from 2 to 4",
    ):
        assert expected in out, (expected, out)


def test_md_to_html_is_self_contained(tmp_path: Path) -> None:
    (tmp_path / "chart.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    md = tmp_path / "report.md"
    md.write_text(
        "# Q3 *report*\n\nSee **this** and [a link](https://e.com/?a=1&b=2).\n\n"
        "- one\n  - nested\n- two\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n![Chart](chart.svg)\n\n"
        "```python\nprint('<b>')\n```\n\n<script>alert(1)</script>\n"
    )
    for flag in ("--builtin", None):
        target = tmp_path / ("builtin.html" if flag else "report.html")
        res = run_script(RW / "md_to_html.py", md, *([flag, "-o", target] if flag else []))
        assert res.returncode == 0, res.stderr
        page = target.read_text()
        assert "<title>Q3 report</title>" in page and "<strong>this</strong>" in page
        assert 'src="data:image/svg+xml;base64,' in page and "<table>" in page
        assert "<script>" not in page and "&lt;script&gt;" in page
        assert "print(&#x27;&lt;b&gt;&#x27;)" in page or "print('&lt;b&gt;')" in page
