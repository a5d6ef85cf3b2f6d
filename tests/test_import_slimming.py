"""compat/lean_imports.py: the daemon does not load the parts of its libraries it never uses
(docs/performance.md, "Memory"), and whoever does use them later gets the real thing. Each test
runs in a fresh interpreter, since what matters is what the first import does."""

from __future__ import annotations

from tests.fresh_python import run_python


def run(code: str) -> str:
    return run_python(code, timeout=180)


def test_the_daemon_leaves_unused_library_parts_out() -> None:
    out = run(
        """
        import sys
        from compat import lean_imports
        lean_imports.install()  # as gateway.cli.main does first
        import gateway.cli.main, gateway.daemon.app, agent.harness, agent.runtime, channels.telegram.channel
        unused = [
            "langgraph_sdk._async.client",  # the LangGraph server client
            "websockets",
            "click", "pygments",  # httpx's command line
            "openai.types.graders", "openai.types.responses.response_create_params",
            "langsmith.types.run",
            "cryptography.hazmat.bindings._rust",  # Telegram Passport
            "PIL",  # until the first image
            "wsgiref.simple_server",  # prometheus_client's own servers
            "kubernetes", "agent.sandbox.kubernetes_provider",  # only with that sandbox provider
        ]
        print([name for name in unused if name in sys.modules])
        """
    )
    assert out == "[]"


def test_deferred_packages_give_the_real_objects_on_use() -> None:
    out = run(
        """
        import sys
        import compat.lean_imports
        compat.lean_imports.install()
        import openai
        from openai.types import ChatModel, Completion
        from openai.types.completion import Completion as Direct
        import openai.types.responses as responses
        import langsmith.types
        from langsmith.types.run import Run
        print(Completion is Direct, ChatModel is sys.modules["openai.types.chat_model"].ChatModel,
              responses.Response is sys.modules["openai.types.responses.response"].Response, langsmith.types.Run is Run)
        """
    )
    assert out == "True True True True"


def test_the_langgraph_server_client_still_works_when_asked_for() -> None:
    out = run(
        """
        import sys
        import compat.lean_imports
        compat.lean_imports.install()
        import deepagents  # binds langgraph_sdk's client names without loading the client
        from deepagents.middleware import async_subagents as sub
        loaded_before = "langgraph_sdk._async.client" in sys.modules
        client = sub.get_client(url="http://127.0.0.1:9")
        from langgraph_sdk.client import LangGraphClient
        print(loaded_before, isinstance(client, sub.LangGraphClient), type(client) is LangGraphClient,
              isinstance(client, LangGraphClient))
        """
    )
    assert out == "False True True True"


def test_telegram_passport_decryption_still_works() -> None:
    """python-telegram-bot's Passport code holds stand-ins for cryptography's names until it
    decrypts something; then they are the real classes."""
    out = run(
        """
        import hashlib, os, sys
        import compat.lean_imports
        compat.lean_imports.install()
        from telegram._passport import credentials
        before = "cryptography.hazmat.bindings._rust" in sys.modules

        payload = b"passport data"
        pad = 16 - len(payload) % 16 + 16
        plain = bytes([pad]) + os.urandom(pad - 1) + payload
        data_hash = hashlib.sha256(plain).digest()
        secret = os.urandom(32)
        key_iv = hashlib.sha512(secret + data_hash).digest()
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        encryptor = Cipher(algorithms.AES(key_iv[:32]), modes.CBC(key_iv[32:48])).encryptor()
        data = encryptor.update(plain) + encryptor.finalize()

        out = credentials.decrypt(secret, data_hash, data)
        real = sys.modules["cryptography.hazmat.primitives.hashes"].SHA256
        class Mine(credentials.SHA256):  # subclassing a stand-in subclasses the real class
            pass
        print(before, out == payload, isinstance(real(), credentials.SHA256), issubclass(Mine, real))
        """
    )
    assert out == "False True True True"


def test_prometheus_and_httpx_cli_load_in_full_when_used() -> None:
    out = run(
        """
        import sys
        import compat.lean_imports
        compat.lean_imports.install()
        import gateway.ops.metrics, httpx
        from gateway.ops.http import build_app
        before = "prometheus_client.exposition" in sys.modules, "click" in sys.modules
        import prometheus_client
        text = prometheus_client.generate_latest().decode()  # the global registry and its collectors
        print(before, "python_info" in text)
        """
    )
    assert out == "(False, False) True"


def test_requests_still_guesses_a_charset() -> None:
    out = run(
        """
        import sys
        import compat.lean_imports
        compat.lean_imports.install()
        import langchain_core.utils.utils  # imports requests, which binds charset_normalizer
        import requests
        before = "charset_normalizer.api" in sys.modules
        response = requests.models.Response()
        response._content = "Grüße aus Köln, ça va très bien".encode("utf-8")
        print(before, response.apparent_encoding)
        """
    )
    assert out == "False utf-8"


def test_httpx_keeps_its_command_line_tool() -> None:
    """httpx imports its CLI for ``httpx.main``: deferred when its requirements are installed,
    and when one is missing httpx still gets the ImportError it handles (its ``main`` then says
    to install ``httpx[cli]``) without loading the others."""
    out = run(
        """
        import importlib.util, sys
        import compat.lean_imports
        compat.lean_imports.install()
        import httpx
        complete = all(importlib.util.find_spec(m) for m in ("click", "pygments", "rich"))
        loaded = "click" in sys.modules
        if complete:
            sys.modules["httpx._main"].print_help  # any name but main loads the real module
            ok = "click" in sys.modules and httpx.main.__module__ == "httpx"
        else:
            ok = httpx.main.__module__ == "httpx" and httpx.main.__code__.co_filename.endswith("__init__.py")
        print(loaded, ok)
        """
    )
    assert out == "False True"


def test_threads_using_a_deferred_module_at_once_see_it_whole() -> None:
    out = run(
        """
        import threading
        import compat.lean_imports
        compat.lean_imports.install()
        import prometheus_client.registry  # the package itself is not run yet
        import prometheus_client
        got, start = [], threading.Barrier(8)

        def use():
            start.wait()
            got.append((prometheus_client.REGISTRY, prometheus_client.generate_latest))

        threads = [threading.Thread(target=use) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(got), len(set(got)), got[0][0] is prometheus_client.registry.REGISTRY)
        """
    )
    assert out == "8 1 True"


def test_http_clients_under_asyncio_leave_trio_and_tiktoken_unloaded_and_both_work_when_used() -> None:
    out = run(
        """
        import asyncio, sys
        import compat.lean_imports
        compat.lean_imports.install()
        import httpx, httpx2
        from langchain_openai import ChatOpenAI

        async def serve(reader, writer):
            await reader.readuntil(b"\\r\\n\\r\\n")
            writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok")
            await writer.drain()
            writer.close()

        async def main():
            server = await asyncio.start_server(serve, "127.0.0.1", 0)
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
            ChatOpenAI(model="m", api_key="sk", base_url=url)  # builds its httpx2 clients
            async with httpx.AsyncClient(trust_env=False) as a, httpx2.AsyncClient(trust_env=False) as b:
                texts = [(await a.get(url)).text, (await b.get(url)).text]
            server.close()
            return texts, url

        texts, url = asyncio.run(main())
        print(texts, "trio._core._run" in sys.modules, "tiktoken.core" in sys.modules)

        import trio  # whoever runs under trio gets the real trio, loaded on use
        async def under_trio():
            async with httpx2.AsyncClient(trust_env=False) as c:
                try:
                    await c.get(url)  # the server is gone: a trio-backend connect error
                except httpx2.ConnectError:
                    return "refused"
        print(trio.run(under_trio), type(trio.Lock()).__module__.startswith("trio"))
        import tiktoken
        print(tiktoken.Encoding is sys.modules["tiktoken.core"].Encoding)
        """
    )
    assert out.splitlines() == ["['ok', 'ok'] False False", "refused True", "True"]
