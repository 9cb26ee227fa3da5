"""NVIDIA Dynamo's standalone KV indexer (ai-dynamo-runtime, ``python -m
dynamo.indexer``) as a router process, driven over its HTTP API.

``register()`` points it at a ZeroMQ KV-event PUB (kvsidecar's
``events.endpoint``) and the matching replay ROUTER; ``matched(tokens)`` is
what ``/query`` answers for worker ``instance_id`` / ``dp_rank`` 0: the
tokens of ``tokens`` that worker holds as a prefix (Dynamo hashes the token
ids into its own block hashes with the registered ``block_size``, so a block
counts when a BlockStored carried its tokens).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from kvsidecar_harness import free_port_range, wait_until


def available() -> bool:
    """ai-dynamo-runtime importable by this Python (tests/integration/requirements.txt)."""
    try:
        return importlib.util.find_spec("dynamo.llm") is not None
    except ModuleNotFoundError:
        return False


class DynamoIndexer:
    def __init__(self, logdir: Path, block_size: int, model: str = "m",
                 wait: bool = True):
        self.block_size, self.model = block_size, model
        self.port = free_port_range(1)
        self.log = open(Path(logdir) / f"dynamo-indexer-{self.port}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port",
                                      str(self.port), "--threads", "1"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = 30.0) -> None:
        wait_until(self._healthy, timeout, "dynamo indexer /health", interval=0.05)

    def _call(self, path: str, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, "dynamo indexer exited"
        try:
            return self._call("/health")[0] == 200
        except OSError:
            return False

    def register(self, pub_port: int, replay_port: int, instance_id: int = 1) -> None:
        code, body = self._call("/register", {
            "instance_id": instance_id, "endpoint": f"tcp://127.0.0.1:{pub_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "model_name": self.model,
            "block_size": self.block_size, "dp_rank": 0})
        assert code == 201, body

    def query(self, tokens: list[int]) -> dict:
        code, body = self._call("/query", {"token_ids": tokens, "model_name": self.model})
        assert code == 200, body
        return body

    def matched(self, tokens: list[int], instance_id: int = 1) -> int:
        """Tokens of `tokens` worker `instance_id` / rank 0 holds as a prefix."""
        return self.query(tokens)["scores"].get(str(instance_id), {}).get("0", 0)

    def log_text(self) -> str:
        self.log.flush()
        try:
            return Path(self.log.name).read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()
