#!/usr/bin/env python3
"""The peers a user compares trainctl with, measured with the transformers installed beside the GPU.

  hf_peers.py train  --out F [--batch 8 --seq 2048 --steps 5 --warmup 2]
      Trains configs/models/bench-1b (the model bench/gpu_train_bench trains) as HF's
      Qwen2VLForConditionalGeneration on text batches of random ids: fp32 parameters, bf16
      autocast, sdpa attention, torch.optim.AdamW, labels = input_ids (HF's shifted cross-entropy),
      as a user of the Trainer without DeepSpeed would. Prints and writes s/step and tokens/s.

  hf_peers.py decode --out F --decode-bench BIN [--batches 1,16,64 --new-tokens 128 --prompt 64]
      Saves a random bench-1b in bf16 with save_pretrained, then greedy-decodes the same prompts
      with HF generate() (KV cache, no eos, exactly --new-tokens per row) and with our decode_bench
      --model_dir on the same weights, with its CUDA graph and without (the two must give the same
      ids); writes tokens/s of all three, the ratios, and how many greedy
      tokens agree (bf16 rounding may part the two after a while; the first tokens should agree).

Runs where torch (CUDA) and transformers are installed (scripts/gpu-check.sh calls it).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

CONFIG_DIR = "configs/models/bench-1b"


def build(dtype):
    cfg = Qwen2VLConfig.from_pretrained(CONFIG_DIR)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2VLForConditionalGeneration(cfg)
    return cfg, model.to(dtype)


def train(args):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg, model = build(torch.float32)
    model.train()
    vocab = cfg.text_config.vocab_size if hasattr(cfg, "text_config") else cfg.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randint(0, vocab, (args.batch, args.seq), device="cuda", generator=g)
               for _ in range(args.warmup + args.steps)]

    def step(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for ids in batches[:args.warmup]:
        step(ids)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for ids in batches[args.warmup:]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(ids)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    res = {"peer": "transformers Qwen2VLForConditionalGeneration, fp32 params, bf16 autocast, "
                   "sdpa, torch AdamW",
           "batch": args.batch, "seq": args.seq, "s_per_step": s, "s_min": min(times),
           "s_max": max(times), "tokens_per_s": args.batch * args.seq / s, "last_loss": loss,
           "peak_bytes": torch.cuda.max_memory_allocated(),
           "parameters": sum(p.numel() for p in model.parameters())}
    print(json.dumps(res), flush=True)
    return res


def decode(args):
    work = args.work
    os.makedirs(work, exist_ok=True)
    model_dir = os.path.join(work, "bench-1b")
    cfg, model = build(torch.bfloat16)
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(2)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = torch.randint(0, 1000, (max(batches), args.prompt), generator=g)
    prompts_file = os.path.join(work, "prompts.json")
    with open(prompts_file, "w") as f:
        json.dump(prompts.tolist(), f)

    hf = {}
    for b in batches:
        ids = prompts[:b].cuda()
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, use_cache=True,
                  min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens,
                  pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            model.generate(ids, **dict(kw, min_new_tokens=4, max_new_tokens=4))  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            secs = time.perf_counter() - t0
        new = out[:, ids.shape[1]:].cpu()
        hf[b] = {"seconds": secs, "tokens_per_s": new.numel() / secs, "tokens": new.tolist()}
        print(json.dumps({"hf_generate_batch": b, "seconds": secs,
                          "tokens_per_s": new.numel() / secs}), flush=True)
    del model
    torch.cuda.empty_cache()

    def run_ours(graph):
        path = os.path.join(work, f"ours_graph_{graph}.json")
        cmd = [args.decode_bench, "--model_dir", model_dir, "--dtype", "bfloat16", "--device",
               "cuda", "--batches", args.batches, "--new_tokens", str(args.new_tokens),
               "--prompts", prompts_file, "--json", path, f"--cuda_graph={str(graph).lower()}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout, r.stderr[-3000:], flush=True)
        if r.returncode != 0:
            raise RuntimeError(f"decode_bench failed ({r.returncode})")
        return {row["batch"]: row for row in json.load(open(path))["rows"]}

    ours = run_ours(True)
    eager = run_ours(False)
    rows = []
    for b in batches:
        a, h = ours[b]["tokens"], hf[b]["tokens"]
        # Greedy agreement: per row, how many leading tokens are equal.
        lead = []
        for ra, rh in zip(a, h):
            n = 0
            while n < min(len(ra), len(rh)) and ra[n] == rh[n]:
                n += 1
            lead.append(n)
        rows.append({"batch": b, "ours_tokens_per_s": ours[b]["tokens_per_s"],
                     "hf_tokens_per_s": hf[b]["tokens_per_s"],
                     "ratio_ours_over_hf": ours[b]["tokens_per_s"] / hf[b]["tokens_per_s"],
                     "ours_prefill_s": ours[b]["prefill_seconds"],
                     "ours_without_graph_tokens_per_s": eager[b]["tokens_per_s"],
                     "graph_over_eager": ours[b]["tokens_per_s"] / eager[b]["tokens_per_s"],
                     "graph_tokens_equal_eager": ours[b]["tokens"] == eager[b]["tokens"],
                     "leading_tokens_equal_median": statistics.median(lead),
                     "rows_fully_equal": sum(n == args.new_tokens for n in lead)})
        print(json.dumps(rows[-1]), flush=True)
    return {"new_tokens": args.new_tokens, "prompt": args.prompt, "dtype": "bfloat16",
            "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "decode"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--decode-bench", dest="decode_bench")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new-tokens", dest="new_tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--work", default="/tmp/hf_peers")
    args = ap.parse_args()
    res = train(args) if args.what == "train" else decode(args)
    res.update({"torch": torch.__version__,
                "transformers": __import__("transformers").__version__})
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
