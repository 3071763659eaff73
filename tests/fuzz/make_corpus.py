#!/usr/bin/env python3
"""Writes the kept seed corpus of the fuzz targets, tests/fuzz/corpus/<target>/.

Small valid inputs (so the fuzzer starts from deep inside each parser) and a few broken ones.
Run from anywhere; it rewrites only the seed files it names (seed-*), never the inputs that
fuzzing runs added or the crash inputs under regressions/. Needs protoc for the worker messages.
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


def job_spec():
    examples = os.path.join(ROOT, "configs", "examples")
    for name in sorted(os.listdir(examples)):
        put("job_spec_fuzz", name, read(os.path.join("configs", "examples", name)))
    spec = {"name": "j", "kind": "sft", "model_name_or_path": "Qwen/Qwen2-VL-2B-Instruct",
            "data_path": "./d", "deepspeed": json.loads(read("configs/ds_zero3_bf16.json")),
            "training": {"per_device_train_batch_size": 2, "bf16": True},
            "resources": {"nodes": 2, "slots_per_node": 4}, "env": {"A": "b"}}
    put("job_spec_fuzz", "inline_ds.json", json.dumps(spec))
    put("job_spec_fuzz", "bad_types.yaml",
        "kind: grpo\nresources: {nodes: -1, slots_per_node: x}\ntraining: [1, 2]\nfoo: 1\n")
    put("job_spec_fuzz", "anchors.yaml", "a: &a [1, 2]\nb: *a\nkind: eval\nname: *a\n")


def deepspeed():
    put("deepspeed_config_fuzz", "ds_zero3_bf16.json", read("configs/ds_zero3_bf16.json"))
    put("deepspeed_config_fuzz", "ds_zero3_cpu.json", read("configs/ds_zero3_cpu.json"))
    full = {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0,
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                   "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                 "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                              "reduce_bucket_size": "auto",
                              "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto"},
        "activation_checkpointing": {"partition_activations": True, "number_checkpoints": 4},
        "wall_clock_breakdown": False, "unknown_key": 1,
    }
    put("deepspeed_config_fuzz", "full.json", json.dumps(full))
    put("deepspeed_config_fuzz", "bad.json",
        '{"train_batch_size": 7, "bf16": {"enabled": true}, "fp16": {"enabled": true},'
        ' "zero_optimization": {"stage": 9, "offload_param": {"device": "nvme"}}}')


def seed_flags():
    flags = ["--kind", "sft", "--num_gpus=8", "src/train_multimodal.py",
             "--model_name_or_path", "Qwen/Qwen2-VL-7B-Instruct", "--data_path", "./data",
             "--deepspeed", "ds_zero3_bf16.json", "--per_device_train_batch_size", "4",
             "--gradient_accumulation_steps", "4", "--learning_rate", "2e-5",
             "--num_train_epochs", "3", "--bf16", "True", "--tf32", "--output_dir", "./out",
             "--logging_steps", "10", "--save_strategy", "epoch"]
    put("seed_flags_fuzz", "sft.txt", "\n".join(flags) + "\n")
    grpo = ["--kind=grpo", "--nnodes", "2", "--num_gpus", "8", "--model_name_or_path", "m",
            "--data_path", "d", "--reward_funcs", "accuracy", "format", "--reward_weights",
            "1.0", "0.5", "--env", "NCCL_DEBUG=INFO", "--label", "team=vision",
            "--node_selector", "gpu=h100", "--priority", "5", "--max_restarts", "2"]
    put("seed_flags_fuzz", "grpo.txt", "\n".join(grpo) + "\n")
    put("seed_flags_fuzz", "bad.txt", "--lerning_rate\nfast\n--bf16=maybe\n--num_gpus=-3\n")


def worker_messages():
    proto_dir = os.path.join(ROOT, "proto")
    texts = {
        "register": '''register { node_name: "node-1" advertise_addr: "10.0.0.1"
            labels { key: "gpu" value: "h100" } boot_id: "b1"
            resources { gpus { index: 0 uuid: "GPU-1" name: "H100" memory_total_bytes: 80000000000 }
                        gpus { index: 1 uuid: "GPU-2" name: "H100" } }
            running_tasks { task_id: "t1" job_id: "job-1" attempt: 1 slots: 2
                            state: TASK_STATE_RUNNING master_port: 29500 } }''',
        "heartbeat": "heartbeat { time { seconds: 1700000000 } }",
        "task_status": '''seq: 3 task_status { task_id: "t1" job_id: "job-1" attempt: 1
            state: TASK_STATE_FAILED failed_rank: 2 exit_code: -1 signal: 9
            last_log_lines: "Traceback" last_log_lines: "CUDA error" message: "rank 2 died" }''',
        "logs": '''seq: 4 logs { lines { seq: 1 job_id: "job-1" rank: 0 stream: "stdout"
            text: "step 1 loss 2.3" time { seconds: 1 } }
            lines { seq: 2 job_id: "job-1" rank: 1 stream: "stderr" text: "warn" } }''',
        "event": '''seq: 5 event { job_id: "job-1" attempt: 1 rank: 0
            json: "{\\"type\\":\\"metric\\",\\"step\\":10,\\"values\\":{\\"loss\\":1.5}}" }''',
        "warning": 'seq: 6 warning { job_id: "job-1" task_id: "t1" message: "OOM" }',
        "bad_stream": 'seq: 7 logs { lines { job_id: "j" stream: "x" text: "y" } }',
    }
    for name, text in texts.items():
        out = subprocess.run(
            ["protoc", "--proto_path", proto_dir, "--encode=trainctl.v1.WorkerMessage",
             os.path.join(proto_dir, "trainctl", "v1", "worker.proto")],
            input=text.encode(), capture_output=True, check=True).stdout
        put("worker_message_fuzz", name + ".pb", out)


def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors():
    put("safetensors_fuzz", "tiny.safetensors", safetensors_file({
        "model.embed_tokens.weight": ("F32", [2, 3], struct.pack("<6f", *range(6))),
        "lm_head.weight": ("BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
        "ids": ("I64", [2], struct.pack("<2q", 1, -1)),
        "mask": ("BOOL", [0], b""),
    }, {"format": "pt"}))
    put("safetensors_fuzz", "truncated.safetensors",
        safetensors_file({"w": ("F16", [4], b"\x00" * 8)})[:-3])
    put("safetensors_fuzz", "overlap.safetensors",
        struct.pack("<Q", 90) + json.dumps({
            "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
            "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}).encode().ljust(90)
        + b"abc")


def byte_symbols():
    # GPT-2's byte-to-unicode table, as tokenizer/internal/byte_level.cc builds it.
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer():
    sym = byte_symbols()

    def symbols(s):
        return "".join(sym[b] for b in s.encode())

    vocab = {sym[b]: b for b in range(256)}
    merges = []
    for left, right in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "w"),
                        ("o", "r"), (" w", "or"), ("l", "d"), (" wor", "ld")]:
        merges.append([symbols(left), symbols(right)])
        vocab.setdefault(symbols(left + right), len(vocab))
    regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

    def added(i, content, special, **extra):
        t = {"id": i, "content": content, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": special}
        t.update(extra)
        return t

    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(1000, "<|im_start|>", True), added(1001, "<|im_end|>", True),
                         added(1002, "<think>", False),
                         added(1003, "<mask>", True, lstrip=True, rstrip=True),
                         added(1004, "[W]", True, single_word=True),
                         added(1005, "café", False, normalized=True)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": {"type": "ByteLevel"},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": merges},
    }
    text = json.dumps(doc, ensure_ascii=False).encode()
    put("tokenizer_fuzz", "tiny.json", text)
    put("tokenizer_fuzz", "tiny_with_text.json",
        text + b"\0hello world<|im_end|> <mask> caf\xc3\xa9 [W]x")
    doc["model"]["dropout"] = 0.1
    put("tokenizer_fuzz", "dropout.json", json.dumps(doc, ensure_ascii=False))


def manifest_doc(samples, shards):
    return {"format": "trainctl-shards", "version": 1, "checksum": "crc32c",
            "patch_dtype": "bfloat16", "pad_token_id": 151643, "num_samples": samples,
            "num_tokens": 10, "num_label_tokens": 4, "num_images": 1, "num_patches": 4,
            "prepared": {"inputs": ["train.jsonl"], "tokenizer": "tok", "min_pixels": 3136,
                         "max_pixels": 12845056, "max_seq_len": 0, "overflow": "drop",
                         "records": 3, "skipped": 1, "truncated": 0, "dropped": 0,
                         "skipped_records": [{"file": "train.jsonl", "line": 2,
                                              "error": "no assistant turn"}]},
            "shards": shards}


def manifest():
    doc = manifest_doc(2, [{"file": "shard-00000.bin", "num_samples": 2, "bytes": 9000,
                            "crc32c": "0123abcd"}])
    put("manifest_fuzz", "manifest.json", json.dumps(doc, indent=2))
    doc["shards"][0]["file"] = "../etc/passwd"
    put("manifest_fuzz", "bad_file.json", json.dumps(doc))
    doc = manifest_doc(5, [{"file": "a", "num_samples": 2, "bytes": 1, "crc32c": "zz"}])
    put("manifest_fuzz", "bad_counts.json", json.dumps(doc))


def shard(records, dtype, version=2):
    """A shard file; records are (input_ids, labels, grids, solution bytes)."""
    out = b"TCSHARD1" + struct.pack("<II", version, dtype)
    offsets = []
    element = 2 if dtype == 1 else 4
    for ids, labels, grids, solution in records:
        offsets.append(len(out))
        patches = sum(t * h * w for t, h, w in grids)
        rec = struct.pack("<4I", len(ids), len(grids), patches, len(solution))
        rec += struct.pack(f"<{len(ids)}i", *ids) + struct.pack(f"<{len(labels)}i", *labels)
        for g in grids:
            rec += struct.pack("<3i", *g)
        rec += bytes(range(256)) * (patches * 1176 * element // 256) + \
            b"\x01" * (patches * 1176 * element % 256)
        rec += solution
        rec += b"\0" * (-len(rec) % 8)
        out += rec
    index_offset = len(out)
    offsets.append(index_offset)
    out += struct.pack(f"<{len(offsets)}Q", *offsets)
    out += struct.pack("<QQ", len(records), index_offset) + b"TCSHEND1"
    return out


def shards():
    put("shard_reader_fuzz", "text.bin",
        shard([([1, 2, 3], [-100, 2, 3], [], b"<answer>2</answer>"),
               ([4, 5], [-100, -100], [], b"")], 0))
    put("shard_reader_fuzz", "image_bf16.bin",
        shard([([151652, 151655, 151653, 7], [-100, -100, -100, 7], [[1, 2, 2]], b"[1,2,3,4]")],
              1))
    put("shard_reader_fuzz", "v1.bin", shard([([9], [9], [], b"")], 0, version=1))
    put("shard_reader_fuzz", "empty.bin", shard([], 0))


def records():
    lines = [
        {"image": "img/a.png", "problem": "How many?", "solution": "<answer>2</answer>"},
        {"image": ["a.png", "b.png"], "conversations": [
            {"from": "human", "value": "<image>\n<image>\nSame?"},
            {"from": "gpt", "value": "Yes."}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "image", "image": "c.jpg"},
                                                   {"type": "text", "text": "What?"}]},
                      {"role": "assistant", "content": "A cat."}]},
        {"image": "a.png", "solution": [10, 20.5, 30, 40], "problem": "Box?"},
        {"conversations": [{"from": "robot", "value": "hi"}]},
    ]
    for i, line in enumerate(lines):
        put("record_parser_fuzz", f"record{i}.json", json.dumps(line))


def png(width, height, color_type, pixel):
    import zlib
    raw = b"".join(b"\0" + pixel * width for _ in range(height))

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def images():
    fixtures = os.path.join(ROOT, "tests", "data", "fixtures")
    for name in sorted(os.listdir(fixtures)):
        if name.endswith(".jpg"):
            put("image_decode_fuzz", name, read(os.path.join("tests", "data", "fixtures", name)))
    put("image_decode_fuzz", "rgb.png", png(30, 29, 2, b"\x10\x80\xf0"))
    put("image_decode_fuzz", "rgba.png", png(8, 40, 6, b"\x01\x02\x03\x80"))
    put("image_decode_fuzz", "gray.png", png(64, 64, 0, b"\x7f"))


def tokens_file():
    h = "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90"
    put("tokens_file_fuzz", "tokens",
        "# subject  role    sha256 of the token, hex\n"
        "alice      user    " + h + "\n"
        "node-1\tworker\t" + h.upper()[::-1] + "  # a comment\r\n"
        "\n"
        "root admin " + "0" * 64 + "\n")
    put("tokens_file_fuzz", "bad_role", "bob superuser " + h + "\n")
    put("tokens_file_fuzz", "twice", "a viewer " + h + "\nb viewer " + h + "\n")
    put("tokens_file_fuzz", "token_not_hash", "carol user s3cr3t\n")


def client_config():
    put("client_config_fuzz", "config",
        "# trainctl client settings\n"
        "coordinator = coordinator.example:50051\n"
        "tls_ca = ~/.config/trainctl/ca.pem   # the cluster's CA\n"
        "tls_cert=/etc/trainctl/me.pem\r\n"
        "tls_key =\t/etc/trainctl/me.key\n"
        "token_file = ~/.config/trainctl/token\n")
    put("client_config_fuzz", "unknown_key", "coordinater = x:1\n")
    put("client_config_fuzz", "no_equals", "\n\ncoordinator x:1\n")


def main():
    job_spec()
    deepspeed()
    seed_flags()
    worker_messages()
    safetensors()
    tokenizer()
    manifest()
    shards()
    records()
    images()
    tokens_file()
    client_config()
    return 0


if __name__ == "__main__":
    sys.exit(main())
