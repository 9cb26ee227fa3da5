"""A stub vLLM gRPC worker for smg (the Shepherd Model Gateway) whose KV events
come from kvsidecar through smg-grpc-servicer's own relay.

    python3 router_smg_worker.py --port P --name w1 --events tcp://H:5600 \
        [--replay tcp://H:5700] --record FILE --tokenizer DIR

It serves smg_grpc_proto's `vllm.grpc.engine.VllmEngine` with just what the
gateway needs to register, route to and stream from a worker:
HealthCheck, GetModelInfo, GetServerInfo, GetLoads, GetTokenizer (the
directory given), Generate (one token, no model: every request is appended
to `--record` as a JSON line {"worker", "input_ids"}) and SubscribeKvEvents,
which is smg-grpc-servicer 0.14.1's real relay (`smg_grpc_servicer.kv_relay
.relay`, what its vLLM servicer runs) subscribed to kvsidecar's PUB and
replay ROUTER in place of the engine's. Everything that decides what the
gateway's KV index holds (gap replay, restart detection, DATA_LOSS on a
failed replay, normalization) is the released code; only the engine is
absent.
"""

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc
from smg_grpc_servicer.kv_relay import Engine, RankSource, relay
from smg_grpc_servicer.tokenizer_bundle import tokenizer_bundle, tokenizer_chunks

BLOCK_SIZE = 16
MODEL = "m"


def write_tokenizer(directory: Path, vocab_size: int = 12000) -> Path:
    """A word-level tokenizer.json (plus config files) where the word
    `w<N>` is token N: a text prompt names its token ids exactly, so the
    gateway's own tokenizer gives the ids the engine's events carry."""
    directory.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(special)}
    vocab.update({f"w{i}": i for i in range(len(special), vocab_size)})
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(special)]
    (directory / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False, "add_eos_token": False}))
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size,
        "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 4096}))
    return directory


class StubWorker(vllm_engine_pb2_grpc.VllmEngineServicer):
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.time()
        self.source = RankSource(rank=0, endpoint=args.events, replay_endpoint=args.replay)

    async def HealthCheck(self, request, context):
        return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="Health")

    async def GetModelInfo(self, request, context):
        return vllm_engine_pb2.GetModelInfoResponse(
            model_path=MODEL, served_model_name=MODEL, tokenizer_path=self.args.tokenizer,
            is_generation=True, max_context_length=4096, max_req_input_len=4096,
            vocab_size=32000, model_type="llama", architectures=["LlamaForCausalLM"],
            eos_token_ids=[2], pad_token_id=0, bos_token_id=1)

    async def GetServerInfo(self, request, context):
        return vllm_engine_pb2.GetServerInfoResponse(
            active_requests=0, uptime_seconds=time.time() - self.started,
            server_type="vllm-grpc", data_parallel_size=1, block_size=BLOCK_SIZE,
            kv_cache_dtype="auto", model_dtype="torch.bfloat16")

    async def GetLoads(self, request, context):
        return vllm_engine_pb2.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), version="stub",
            dp_rank_count=1, loads=[vllm_engine_pb2.SchedulerLoad(
                dp_rank=0, max_total_num_tokens=1 << 20, max_running_requests=256)])

    async def GetTokenizer(self, request, context):
        data, sha = await tokenizer_bundle(Path(self.args.tokenizer))
        for chunk in tokenizer_chunks(data, sha):
            yield chunk

    async def Generate(self, request, context):
        ids = list(request.tokenized.input_ids)
        with open(self.args.record, "a") as f:
            f.write(json.dumps({"worker": self.args.name, "input_ids": ids}) + "\n")
        yield vllm_engine_pb2.GenerateResponse(complete=vllm_engine_pb2.GenerateComplete(
            output_ids=[2], finish_reason="stop", prompt_tokens=len(ids),
            completion_tokens=1))

    async def Abort(self, request, context):
        return vllm_engine_pb2.AbortResponse()

    async def SubscribeKvEvents(self, request, context):
        logging.info("SubscribeKvEvents start_sequence_number=%d", request.start_sequence_number)
        async for batch in relay([self.source], Engine.VLLM, request.start_sequence_number,
                                 context):
            yield batch


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--events", required=True, help="kvsidecar's PUB, tcp://host:port")
    p.add_argument("--replay", default=None, help="kvsidecar's replay ROUTER")
    p.add_argument("--record", required=True)
    p.add_argument("--tokenizer", required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = grpc.aio.server()
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(StubWorker(args), server)
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    await server.start()
    logging.info("stub worker %s serving on 127.0.0.1:%d", args.name, args.port)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
