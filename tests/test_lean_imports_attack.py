"""compat/lean_imports.py under attack: every path through the daemon's libraries that touches a
deferred module or a stand-in behaves as it does without lean imports. Each test runs the same code
twice in fresh interpreters, once with ``compat.lean_imports`` imported first (as ``chital run``
does) and once without, and compares what comes out: values, exception types and messages."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.fresh_python import REPO, run_python

LEAN = "import compat.lean_imports  # noqa\ncompat.lean_imports.install()\n"


def run(code: str, *, lean: bool, env: dict[str, str] | None = None, cwd: Path = REPO) -> str:
    source = (LEAN if lean else "") + textwrap.dedent(code)
    return run_python(
        source, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, cwd=cwd
    )


def both(code: str, **kw: object) -> tuple[str, str]:
    """(with lean imports, without): the caller asserts they are equal."""
    return run(code, lean=True, **kw), run(code, lean=False, **kw)  # type: ignore[arg-type]


MODEL_PATHS = """
import asyncio, copy, json, pickle, sys, typing
from pydantic import BaseModel, Field
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

class Weather(BaseModel):
    \"\"\"Weather in a city.\"\"\"
    city: str = Field(description="the city")
    celsius: int

class TD(typing.TypedDict):
    city: str

fake = FakeOpenAI.start_in_thread()
out = []
try:
    from langchain_openai import ChatOpenAI
    import openai
    m = ChatOpenAI(base_url=fake.base_url, api_key="k", model="m", max_retries=0)
    fake.script(Reply(text="hello"))
    out.append(m.invoke("hi").content)
    fake.script(Reply(text="hello there"))
    out.append("".join(c.content for c in m.stream("hi")))
    call = ToolCall("Weather", {"city": "Oslo", "celsius": 3})
    fake.script(Reply(tool_calls=[call]))
    out.append(m.bind_tools([Weather], strict=True).invoke("w?").tool_calls)
    out.append(fake.requests[-1]["tools"])
    fake.script(Reply(tool_calls=[call]))
    acc = None
    for c in m.bind_tools([Weather], strict=True).stream("w?"):
        acc = c if acc is None else acc + c
    out.append(acc.tool_calls)
    out.append(pickle.loads(pickle.dumps(acc)).tool_calls == copy.deepcopy(acc).tool_calls)
    for method in ("json_schema", "function_calling", "json_mode"):
        if method == "function_calling":
            fake.script(Reply(tool_calls=[ToolCall("Weather", {"city": "Rome", "celsius": 20})]))
        else:
            fake.script(Reply(text=json.dumps({"city": "Rome", "celsius": 20})))
        s = m.with_structured_output(Weather, method=method, include_raw=True).invoke("w?")
        out.append((method, repr(s["parsed"]), s["parsing_error"], fake.requests[-1].get("response_format")))
    fake.script(Reply(text='{"city": "Rome", "celsius": "warm"}'))  # does not validate
    try:
        m.with_structured_output(Weather, method="json_schema").invoke("w?")
    except Exception as e:
        out.append((type(e).__module__, type(e).__name__, e.errors()[0]["loc"]))
    fake.script(Reply(text=json.dumps({"city": "Rome", "celsius": 20})))
    out.append(repr(list(m.with_structured_output(Weather, method="json_schema").stream("w?"))[-1]))
    fake.script(Reply(text=json.dumps({"city": "Rome"})))
    out.append(m.with_structured_output(TD, method="json_schema").invoke("x"))

    async def concurrent():
        fake.script(Reply(text="a1"), Reply(text="a2"))
        first, second = await asyncio.gather(m.ainvoke("x"), m.ainvoke("y"))
        fake.script(Reply(text="streamed"))
        return sorted([first.content, second.content]), "".join([c.content async for c in m.astream("z")])

    out.append(asyncio.run(concurrent()))

    # Chital's own model (agent/model.py: plain streamed chunks picked by ``cast_to is
    # ChatCompletionChunk``, the untransformed request body) over the same paths, and an image.
    from agent.config import AgentSettings, ModelSpec
    from agent.model import build_chat_model
    from langchain_core.messages import HumanMessage

    cm = build_chat_model(ModelSpec(model="m", base_url=fake.base_url, api_key="k"), AgentSettings())

    async def chital():
        fake.script(Reply(text="chital stream"))
        text = "".join([c.content async for c in cm.astream("hi")])
        fake.script(Reply(tool_calls=[call]))
        acc = None
        async for c in cm.bind_tools([Weather], strict=True).astream("w?"):
            acc = c if acc is None else acc + c
        fake.script(Reply(text=json.dumps({"city": "Rome", "celsius": 20})))
        structured = await cm.with_structured_output(Weather, method="json_schema").ainvoke("w?")
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        fake.script(Reply(text="an image"))
        seen = await cm.ainvoke([HumanMessage(content=[{"type": "text", "text": "what?"}, image])])
        sent = fake.requests[-1]["messages"][0]["content"][1]["type"]
        return text, acc.tool_calls, repr(structured), seen.content, sent

    out.append(asyncio.run(chital()))
    for status in (400, 401, 429, 500):
        fake.script(Reply(status=status, error_message=f"boom {status}"))
        try:
            m.invoke("x")
        except openai.APIStatusError as e:
            out.append((type(e).__name__, [c.__module__ for c in type(e).__mro__][:3], str(e), e.status_code))
    client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    fake.script(Reply(text="raw"))
    resp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    from openai.types.chat import ChatCompletion
    out.append((isinstance(resp, ChatCompletion), type(resp).__module__, type(resp).__qualname__))
    out.append((pickle.loads(pickle.dumps(resp)) == resp, copy.deepcopy(resp) == resp))
    out.append((sorted(ChatCompletion.model_fields), ChatCompletion.model_json_schema()["title"]))
    fake.script(Reply(text=json.dumps({"city": "Rome", "celsius": 20})))
    parsed = client.beta.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "x"}], response_format=Weather
    )
    out.append((type(parsed).__name__, repr(parsed.choices[0].message.parsed)))
    out.append(len([n for n in dir(sys.modules["openai.types.chat"]) if not n.startswith("_")]))
    try:
        exec("from openai.types import NoSuchType")
    except ImportError as e:
        out.append((type(e).__name__, str(e)))
finally:
    fake.stop()
for o in out:
    print(o)
print("---", "openai.types.graders" in sys.modules)
"""


def test_the_chat_model_paths_are_the_same_with_deferred_openai_types() -> None:
    """Tool calls (strict), structured output in its three methods (and a parse error), streaming
    and not, concurrent async calls, API errors, the raw client's types pickled, copied and turned
    into a JSON schema: langchain-openai and openai over the fake model, with and without."""
    lean, plain = both(MODEL_PATHS)
    lean_out, lean_loaded = lean.rsplit("---", 1)
    plain_out, plain_loaded = plain.rsplit("---", 1)
    assert lean_out == plain_out
    assert "Weather(city='Rome', celsius=20)" in lean_out and "OpenAIRateLimitError" in lean_out
    # All of that without the rest of the API's types (the saving survives real use).
    assert (lean_loaded.strip(), plain_loaded.strip()) == ("False", "True")


STAND_INS = """
import copy, importlib, inspect, pickle, sys
sys.path.insert(0, {pkgs!r})
if "compat.lean_imports" in sys.modules:
    from compat import lean_imports
    sys.meta_path.insert(0, lean_imports._Finder({{"goodpkg": ("Thing", "make"), "badpkg": (), "trypkg": ()}}))

def attempt(label, f):
    try:
        print(label, "->", repr(f()))
    except Exception as e:
        print(label, "!!", type(e).__name__, e)

attempt("import badpkg", lambda: importlib.import_module("badpkg"))
attempt("badpkg in sys.modules", lambda: "badpkg" in sys.modules)
attempt("import badpkg again", lambda: importlib.import_module("badpkg"))
import trypkg  # its body fails in a way no import line shows: it is deferred, and fails on use
attempt("trypkg.value", lambda: trypkg.value)
attempt("trypkg.value again", lambda: trypkg.value)
attempt("trypkg.sub", lambda: trypkg.sub)
from goodpkg import Thing, make
real = lambda name: sys.modules["goodpkg"].__dict__[name]
attempt("Thing.__module__", lambda: Thing.__module__)
attempt("Thing.__doc__", lambda: Thing.__doc__)
attempt("Thing.__qualname__", lambda: Thing.__qualname__)
attempt("inspect.isclass", lambda: inspect.isclass(Thing))
attempt("signature", lambda: str(inspect.signature(make)))
attempt("Thing | None", lambda: Thing | None)
attempt("None | Thing", lambda: None | Thing)
attempt("deepcopy", lambda: copy.deepcopy(Thing) is real("Thing"))
attempt("copy", lambda: copy.copy(make) is real("make"))
attempt("pickle class", lambda: pickle.loads(pickle.dumps(Thing)) is real("Thing"))
attempt("pickle instance", lambda: type(pickle.loads(pickle.dumps(make()))) is real("Thing"))
attempt("identity", lambda: (Thing is real("Thing"), make is real("make")))
attempt("dict key", lambda: {{Thing: 1}}.get(real("Thing")))
attempt("isinstance", lambda: (isinstance(make(), Thing), type(make()) is Thing))
class Mine(Thing):
    pass
attempt("subclass", lambda: (issubclass(Mine, Thing), Mine.__mro__[1] is real("Thing")))
attempt("error through", lambda: make(1))
attempt("except through", lambda: Thing.fail())
attempt("reload", lambda: importlib.reload(sys.modules["goodpkg"]).RUNS)
attempt("after reload", lambda: (type(sys.modules["goodpkg"].make).__name__, make is real("make")))
"""


def _packages(root: Path) -> Path:
    (root / "badpkg").mkdir(parents=True)
    (root / "badpkg" / "__init__.py").write_text(
        "import json\nfrom .sub import thing\nimport not_installed_xyz\n"
    )
    (root / "badpkg" / "sub.py").write_text("thing = 1\n")
    (root / "trypkg").mkdir()
    (root / "trypkg" / "__init__.py").write_text(
        "from . import sub\nvalue = 1\nif value:\n    import not_installed_xyz\n"
    )
    (root / "trypkg" / "sub.py").write_text("")
    (root / "goodpkg").mkdir()
    (root / "goodpkg" / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """The good package."""
            class Thing:
                """A thing."""
                @staticmethod
                def fail():
                    raise KeyError("no such thing")
            def make(size: int = 0) -> Thing:
                if size:
                    raise ValueError(f"size {size} is too big")
                return Thing()
            RUNS = globals().get("RUNS", 0) + 1
            '''
        )
    )
    return root


def test_stand_ins_and_failed_bodies_act_as_without(tmp_path: Path) -> None:
    """A module whose dependency is missing fails at import (ModuleNotFoundError, every time,
    not installed in sys.modules); one whose body fails later fails again on every use (never a
    half-run module); a stand-in answers ``__module__``, ``__doc__``, ``inspect``, ``X | None``,
    copy, pickle, subclassing and exceptions as the real object, and is the real object once its
    module has run (identity, dict keys); ``importlib.reload`` runs the body."""
    code = STAND_INS.format(pkgs=str(_packages(tmp_path / "pkgs")))
    lines = run(code, lean=True).splitlines()
    assert lines[:6] == [
        "import badpkg !! ModuleNotFoundError No module named 'not_installed_xyz'",
        "badpkg in sys.modules -> False",
        "import badpkg again !! ModuleNotFoundError No module named 'not_installed_xyz'",
        # Without lean imports this fails at ``import trypkg`` (a body that fails behind an
        # ``if``): deferred, it fails on each use, the same way, and never gives a half-run module.
        "trypkg.value !! ModuleNotFoundError No module named 'not_installed_xyz'",
        "trypkg.value again !! ModuleNotFoundError No module named 'not_installed_xyz'",
        "trypkg.sub !! ModuleNotFoundError No module named 'not_installed_xyz'",
    ]


def test_stand_ins_match_the_real_objects_once_loaded(tmp_path: Path) -> None:
    code = STAND_INS.format(pkgs=str(_packages(tmp_path / "pkgs"))).replace("import trypkg  #", "#")
    code = code.replace('attempt("trypkg', '# attempt("trypkg')
    lean, plain = both(code)
    assert lean == plain
    assert "identity -> (True, True)" in lean and "dict key -> 1" in lean


# Each on a stand-in whose module has not run yet (a fresh interpreter per line: once loaded, the
# stand-ins in module globals are the real objects and would prove nothing).
FIRST_USES = [
    "Thing.__module__",
    "Thing.__doc__",
    "Thing.__name__, Thing.__qualname__",
    "inspect.isclass(Thing), inspect.isfunction(make), isinstance(Thing, type)",
    "str(inspect.signature(make))",
    "Thing | None",
    "None | Thing",
    "list[Thing]",
    "copy.deepcopy(Thing) is real('Thing'), copy.copy(make) is real('make')",
    "pickle.loads(pickle.dumps(Thing)) is real('Thing')",
    "pickle.loads(pickle.dumps(make)) is real('make')",
    "isinstance(make(), Thing), type(make()) is real('Thing')",
    "issubclass(types.new_class('Mine', (Thing,)), real('Thing'))",
    "issubclass(type('Mine', (Thing,), {}), real('Thing'))",
    "make(1)",
    "Thing.fail()",
    "repr(make).split(' at ')[0]",
]
FIRST_USE = """
import copy, inspect, pickle, sys, types
sys.path.insert(0, {pkgs!r})
if "compat.lean_imports" in sys.modules:
    from compat import lean_imports
    sys.meta_path.insert(0, lean_imports._Finder({{"goodpkg": ("Thing", "make")}}))
from goodpkg import Thing, make
real = lambda name: getattr(sys.modules["goodpkg"], name)
try:
    print(repr({expr}))
except Exception as e:
    print(type(e).__name__, e)
"""


def test_the_first_use_of_a_stand_in_acts_as_the_real_object(tmp_path: Path) -> None:
    """Introspection (``__module__``, ``__doc__``, ``inspect``, ``isinstance(x, type)``), typing
    (``X | None``, ``list[X]``), copy, pickle, subclassing and exceptions raised through it: on a
    stand-in whose module has not run, each gives what the real object gives."""
    pkgs = str(_packages(tmp_path / "pkgs"))
    differ = []
    for expr in FIRST_USES:
        lean, plain = both(FIRST_USE.format(pkgs=pkgs, expr=expr))
        if lean != plain:
            differ.append((expr, lean, plain))
    # What a stand-in cannot be: its repr says so, and it is no base for a class built by
    # ``type()`` or ``types.new_class`` (they see ``isinstance(stand_in, type)`` and take it as
    # is; a class statement works). None of the listed names is used so (test below).
    assert [(expr, lean) for expr, lean, _ in differ] == [
        (
            "issubclass(types.new_class('Mine', (Thing,)), real('Thing'))",
            "TypeError _Proxy.__init__() takes 3 positional arguments but 4 were given",
        ),
        (
            "issubclass(type('Mine', (Thing,), {}), real('Thing'))",
            "TypeError type() doesn't support MRO entry resolution; use types.new_class()",
        ),
        ("repr(make).split(' at ')[0]", "'<not yet imported: goodpkg.make>'"),
    ]


def _passport(root: Path) -> dict[str, str]:
    """A Telegram Passport credentials blob encrypted for a fresh key (the bot's private key)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    payload = json.dumps({"secure_data": {}, "nonce": "n-1"}).encode()
    pad = 16 - len(payload) % 16 + 16
    plain = bytes([pad]) + os.urandom(pad - 1) + payload
    data_hash = hashlib.sha256(plain).digest()
    secret = os.urandom(32)
    key_iv = hashlib.sha512(secret + data_hash).digest()
    enc = Cipher(algorithms.AES(key_iv[:32]), modes.CBC(key_iv[32:48])).encryptor()
    data = enc.update(plain) + enc.finalize()
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    (root / "key.pem").write_bytes(pem)
    b64 = base64.b64encode
    return {
        "PP_DATA": b64(data).decode(),
        "PP_HASH": b64(data_hash).decode(),
        "PP_SECRET": b64(key.public_key().encrypt(secret, oaep)).decode(),
        "PP_KEY": str(root / "key.pem"),
    }


PASSPORT = """
import os, sys, threading
from telegram import Bot
from telegram._passport.credentials import EncryptedCredentials
from telegram.error import PassportDecryptionError
before = "cryptography.hazmat.bindings._rust" in sys.modules
bot = Bot("123:abc", private_key=open(os.environ["PP_KEY"], "rb").read())
got, start = [], threading.Barrier(4)

def decrypt(i):
    start.wait()
    creds = EncryptedCredentials(data=os.environ["PP_DATA"], hash=os.environ["PP_HASH"], secret=os.environ["PP_SECRET"])
    creds.set_bot(bot)
    got.append(creds.decrypted_data.nonce)

threads = [threading.Thread(target=decrypt, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(got)
bad = EncryptedCredentials(data=os.environ["PP_DATA"], hash=os.environ["PP_HASH"], secret="AAAA")
bad.set_bot(bot)
try:
    bad.decrypted_secret
except PassportDecryptionError as e:
    print(type(e).__name__, e)
try:
    Bot("123:abc", private_key=b"not a key")
except Exception as e:
    print(type(e).__module__, type(e).__name__, e)
print("--- before", before)
"""


def test_telegram_passport_through_a_real_bot_key(tmp_path: Path) -> None:
    """python-telegram-bot's Passport path end to end: the bot's private key loaded through the
    stand-ins for ``default_backend`` and ``serialization``, credentials decrypted by four threads at
    once (OAEP, MGF1, SHA1, AES-CBC, SHA512 stand-ins), a wrong secret and a bad key failing with
    the same error type and text as without lean imports."""
    env = _passport(tmp_path)
    lean, plain = both(PASSPORT, env=env)
    assert lean.split("--- before")[0] == plain.split("--- before")[0]
    assert "['n-1', 'n-1', 'n-1', 'n-1']" in lean and "PassportDecryptionError" in lean
    assert lean.endswith("--- before False")


TRACING = """
import json, threading, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
posts = []

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        posts.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"batch_ingest_config": {}, "instance_flags": {}}).encode())

    def log_message(self, *a):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
import os
os.environ["LANGSMITH_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
from tests.fakes.openai_server import FakeOpenAI, Reply
from langchain_openai import ChatOpenAI
from langchain_core.tracers.langchain import wait_for_all_tracers
from langsmith import traceable, Client
fake = FakeOpenAI.start_in_thread()
m = ChatOpenAI(base_url=fake.base_url, api_key="k", model="m", max_retries=0)

@traceable(name="outer")
def outer(q):
    return m.invoke(q).content

fake.script(Reply(text="traced answer"))
print(outer("hello"))
wait_for_all_tracers()
Client().flush() if hasattr(Client, "flush") else None
fake.stop()
names = set()
for path, body in posts:
    for name in ("outer", "ChatOpenAI"):
        if name.encode() in body:
            names.add(name)
print(sorted(names), bool(posts))
"""


def test_langsmith_tracing_with_deferred_types() -> None:
    """Tracing switched on by environment: runs reach a (fake) LangSmith endpoint with the
    deferred ``langsmith.types`` and ``charset_normalizer``, as without lean imports."""
    env = {"LANGSMITH_TRACING": "true", "LANGSMITH_API_KEY": "ls-test", "LANGSMITH_PROJECT": "p"}
    lean, plain = both(TRACING, env=env)
    assert lean == plain
    assert lean.endswith("['ChatOpenAI', 'outer'] True")


def test_scans_of_every_module_do_not_load_deferred_bodies() -> None:
    """Libraries that walk ``sys.modules`` asking each module for a name (pickle.whichmodule,
    inspect.getmodule, doctest's ``__test__``) find what they would have found without running
    the deferred bodies (whose import is the memory saved): a name no statement of the body binds
    is not there."""
    out = run(
        """
        import inspect, pickle, sys, types
        import gateway.cli.main, gateway.daemon.app, agent.harness, agent.runtime, channels.telegram.channel
        import langchain_openai
        def f(): pass
        f.__module__ = None
        where = pickle.whichmodule(f, "f")
        inspect.getmodule(f)
        hasattr(sys.modules["langgraph_sdk"], "__test__")  # doctest and pytest ask this
        print(where, [n for n in ("openai.types.graders", "langsmith.types.run", "cryptography.hazmat.bindings._rust", "websockets") if n in sys.modules])
        """,
        lean=True,
    )
    assert out == "__main__ []"


CIRCULAR = """
import sys, threading
sys.path.insert(0, {root!r})
if "compat.lean_imports" in sys.modules:
    from compat import lean_imports
    sys.meta_path.insert(0, lean_imports._Finder({{"apkg": ()}}))
    import apkg  # deferred: its body runs on first use, in thread one
import coord
out = {{}}

def one():
    import apkg
    out["one"] = apkg.x

def two():
    coord.a_running.wait(5)
    import bmod
    out["two"] = bmod.y

threads = [threading.Thread(target=one, daemon=True), threading.Thread(target=two, daemon=True)]
for t in threads:
    t.start()
for t in threads:
    t.join(10)
print("hung" if any(t.is_alive() for t in threads) else "done", sorted(out.items()))
"""


def test_threads_whose_bodies_need_each_other_do_not_hang(tmp_path: Path) -> None:
    """Thread one runs a deferred package's body, which imports ``bmod``; thread two is importing
    ``bmod``, whose body needs the package. A real import detects that deadlock and gives thread
    two the partial module (AttributeError); deferred, the body runs under the same import lock
    and ends the same way instead of hanging both threads."""
    (tmp_path / "apkg").mkdir()
    (tmp_path / "coord.py").write_text(
        "import threading\na_running = threading.Event()\nb_running = threading.Event()\n"
    )
    (tmp_path / "apkg" / "__init__.py").write_text(
        "import coord\ncoord.a_running.set()\ncoord.b_running.wait(5)\nimport bmod\nx = 1\n"
    )
    (tmp_path / "bmod.py").write_text(
        "import time, coord\ncoord.b_running.set()\ntime.sleep(0.3)\nimport apkg\n"
        "try:\n    y = apkg.x\nexcept AttributeError as e:\n    y = str(e)\n"
    )
    lean, plain = both(CIRCULAR.format(root=str(tmp_path)))
    assert lean == plain
    assert lean.startswith("done [('one', 1), ('two', \"partially initialized module 'apkg'")


CLI = """
import sys, types
if {plain!r}:  # without: gateway.cli's compat.lean_imports is a module whose install does nothing
    sys.modules["compat.lean_imports"] = stub = types.ModuleType("compat.lean_imports")
    stub.install = lambda: None
sys.argv = ["chital", *{argv!r}]
from gateway.cli.main import main
try:
    code = main()
except SystemExit as e:
    code = e.code
print("exit", code)
"""


def _cli(argv: list[str], plain: bool, cwd: Path) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", CLI.format(plain=plain, argv=argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return done.stdout.replace(str(cwd), "<tmp>"), done.stderr.replace(str(cwd), "<tmp>")


def test_chital_check_says_the_same_with_and_without(tmp_path: Path) -> None:
    """``chital check`` over a model whose package is not installed, one whose class is missing
    and a working one: the same lines and exit codes with lean imports as without (what the
    operator reads does not depend on them)."""
    import yaml

    from tests.daemon import base_config, free_port

    outputs = []
    for use in ("no_such_package_xyz:Model", "langchain_openai:NoSuchModel", "langchain_openai:ChatOpenAI"):
        cfg = base_config(tmp_path / "data", "http://127.0.0.1:9/v1", free_port())
        cfg["models"][0]["use"] = use
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
        argv = ["check", "--config", "config.yaml"]
        lean = _cli(argv, False, tmp_path)
        plain = _cli(argv, True, tmp_path)
        assert lean == plain, use
        outputs.append(lean)
    assert any("no_such_package_xyz" in out + err for out, err in outputs)


def test_no_stand_in_is_an_exception_class_and_each_is_what_its_module_binds() -> None:
    """``except Name:`` needs the real class, and a stand-in for a name the module does not bind
    would fail only when used: every listed stand-in, once loaded, is a non-exception object of
    its module."""
    out = run(
        """
        import importlib
        from compat.lean_imports import DEFERRED
        bad = []
        for module, names in DEFERRED.items():
            try:
                loaded = importlib.import_module(module)
            except ImportError:
                continue  # not installed (httpx's CLI): nothing is bound
            for name in names:
                getattr(getattr(loaded, name), "__name__", None)  # loads the module
                real = getattr(loaded, name)
                if type(real).__name__ == "_Proxy" or (isinstance(real, type) and issubclass(real, BaseException)):
                    bad.append(f"{module}.{name}")
        print(bad)
        """,
        lean=True,
    )
    assert out == "[]"


RESOURCES = """
import importlib.resources, importlib.util, inspect, pkgutil, sys
import openai, prometheus_client.registry, langgraph_sdk.auth.types
out = [
    importlib.util.find_spec("httpx._main") is not None,
    sorted(m.name for m in pkgutil.iter_modules(sys.modules["openai.types"].__path__))[:5],
    importlib.resources.files("openai.types").joinpath("chat_model.py").is_file(),
    inspect.getsource(sys.modules["openai.types.chat"]).splitlines()[2][:40],
    inspect.getmodule(sys.modules["openai.types"].ChatModel) is sys.modules.get("typing"),
    sys.modules["prometheus_client"].__name__, sys.modules["prometheus_client"].__file__.rsplit("/", 2)[1:],
    type(sys.modules["langgraph_sdk"].__version__).__name__,
]
for o in out:
    print(o)
"""


def test_finders_resources_and_source_of_deferred_packages() -> None:
    """``importlib.util.find_spec``, ``pkgutil``, ``importlib.resources``, ``inspect.getsource``
    and module metadata of deferred packages answer as without lean imports."""
    lean, plain = both(RESOURCES)
    assert lean == plain
    assert lean.startswith("True\n")


async def test_a_working_daemon_still_leaves_the_unused_parts_out(tmp_path: Path) -> None:
    """``chital run`` with Telegram: a DM whose answer takes a tool call and /metrics scraped
    work, and afterwards the daemon's process has mapped none of the native libraries behind the
    stand-ins (cryptography's Rust bindings, websockets, charset_normalizer): using the daemon
    does not quietly undo the saving (stand-ins used by ``isinstance`` or a scan would load them)."""
    from tests.daemon import DaemonProcess
    from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
    from tests.fakes.telegram_server import FakeTelegram
    from tests.telegram_daemon import OWNER, answered, telegram_config

    async with FakeOpenAI() as model:
        tg = FakeTelegram()
        await tg.start()
        try:
            todo = ToolCall("write_todos", {"todos": [{"content": "check the weather", "status": "pending"}]})
            model.script(Reply(tool_calls=[todo]), Reply(text="done: the plan is written"))
            daemon = DaemonProcess(tmp_path, telegram_config(tmp_path, tg, model))
            await daemon.start()
            try:
                up = tg.inject_message(OWNER, OWNER, "plan my day")
                await answered(tg, OWNER, up, "the plan is written")
                roles = [m["role"] for m in model.requests[-1]["messages"]]
                assert "tool" in roles, roles  # the tool ran and its result went back
                assert 'chital_messages_in_total{channel="telegram"} 1.0' in await daemon.metrics()
                assert daemon.proc is not None
                maps = Path(f"/proc/{daemon.proc.pid}/maps").read_text()
            finally:
                await daemon.close()
        finally:
            await tg.stop()
    loaded = [lib for lib in ("bindings/_rust", "websockets/", "charset_normalizer/") if lib in maps]
    assert loaded == []


def test_no_library_uses_a_stand_in_where_it_cannot_act_as_the_real_object() -> None:
    """What a stand-in cannot imitate, searched for in the source of every module of the daemon
    (all the channels) that holds one: a base in ``type(name, bases, ns)`` or
    ``types.new_class``, ``type(stand_in)``, ``is``/``is not`` against it, a key of a dict
    display or a set, an ``except`` clause, a ``match`` class pattern."""
    out = run(
        """
        import ast, inspect, sys
        import gateway.cli.main, gateway.daemon.app, agent.harness, agent.runtime
        import channels.telegram.channel, channels.slack.channel, channels.discord.channel, channels.lark.channel
        import channels.matrix.channel, channels.whatsapp.channel, channels.dingtalk.channel, channels.wecom.channel
        from compat.lean_imports import _Proxy
        holders = {}
        for name, module in list(sys.modules.items()):
            held = {k for k, v in list(vars(module).items()) if type(v) is _Proxy}
            if held:
                holders[name] = held
        names = lambda node: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node else set()
        found = []
        for name, held in holders.items():
            try:
                tree = ast.parse(inspect.getsource(sys.modules[name]))
            except (OSError, TypeError):
                continue
            for node in ast.walk(tree):
                bad = set()
                if isinstance(node, ast.Call):
                    func = node.func
                    if isinstance(func, ast.Name) and func.id == "type":
                        bad = set().union(*map(names, node.args[:2]))
                    elif isinstance(func, ast.Attribute) and func.attr in ("new_class", "resolve_bases"):
                        bad = set().union(*map(names, node.args))
                elif isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
                    bad = names(node)
                elif isinstance(node, ast.Dict):
                    bad = {k.id for k in node.keys if isinstance(k, ast.Name)}
                elif isinstance(node, ast.Set):
                    bad = {k.id for k in node.elts if isinstance(k, ast.Name)}
                elif isinstance(node, ast.ExceptHandler):
                    bad = names(node.type)
                elif isinstance(node, ast.MatchClass):
                    bad = names(node.cls)
                if bad & held:
                    found.append((name, node.lineno, sorted(bad & held)))
        print(sorted(holders), found)
        """,
        lean=True,
    )
    assert out.endswith("]) []") or out.endswith("] []"), out
    assert "telegram._passport.credentials" in out and "deepagents.middleware.async_subagents" in out


HTTPX_CLI = """
import sys
sys.path.insert(0, {stubs!r})  # a stand-in "rich" (not installed here) so that httpx's CLI is deferred
import httpx
before = "click" in sys.modules, httpx.main.__module__
cli = sys.modules["httpx._main"]
cli.print_help  # any other name of the module runs its body
print(before[1], httpx.main is cli.main, type(httpx.main).__name__, cli.main.__module__, "click" in sys.modules)
print("--- before", before[0])
"""


def test_httpx_cli_stand_in_when_its_requirements_are_there(tmp_path: Path) -> None:
    """With click, pygments and rich importable, ``httpx.main`` is a stand-in: httpx's own
    ``main.__module__ = "httpx"`` reaches the real function when it loads, and ``httpx.main`` is
    then the real function, as without lean imports."""
    rich = tmp_path / "rich"
    rich.mkdir()
    for name in ("__init__", "console", "markup", "progress", "syntax", "table"):
        (rich / f"{name}.py").write_text("")
    lean, plain = both(HTTPX_CLI.format(stubs=str(tmp_path)))
    assert lean.split("---")[0] == plain.split("---")[0]
    assert lean.split("---")[0].strip() == "httpx True Command httpx True"
    assert lean.endswith("--- before False")


CRYPTO = """
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.exceptions import InvalidSignature

key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
sig = key.sign(b"msg", pss, hashes.SHA256())
key.public_key().verify(sig, b"msg", pss, hashes.SHA256())
try:
    key.public_key().verify(sig, b"other", pss, hashes.SHA256())
except InvalidSignature as e:
    print("InvalidSignature", type(e).__module__)
pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
print(type(serialization.load_pem_private_key(pem, None)).__name__)
try:
    serialization.load_pem_private_key(b"-----BEGIN PRIVATE KEY-----\\nAAAA\\n-----END PRIVATE KEY-----\\n", None)
except ValueError as e:
    print("ValueError", str(e)[:60])
try:
    Cipher(algorithms.AES(b"short"), modes.CBC(b"0" * 16))
except ValueError as e:
    print("ValueError", e)
digest = hashes.Hash(hashes.SHA256())
digest.update(b"x")
print(digest.finalize().hex()[:16], isinstance(hashes.SHA256(), hashes.HashAlgorithm))
f = Fernet(Fernet.generate_key())
print(f.decrypt(f.encrypt(b"secret")))
print(ec.generate_private_key(ec.SECP256R1()).curve.name)
"""


def test_cryptography_used_directly_after_telegram_deferred_it() -> None:
    """Another part of the process (a test, a plugin) using cryptography after python-telegram-bot
    took stand-ins for it: signatures, keys, ciphers, Fernet and their errors, as without."""
    lean, plain = both("import telegram\n" + CRYPTO)
    assert lean == plain
    assert "InvalidSignature cryptography.exceptions" in lean and "b'secret'" in lean
