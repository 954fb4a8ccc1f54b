"""Rollouts from an OpenAI-compatible server (vLLM, SGLang, ...) as grpo-rollout/1 records
(docs/rollouts.md), for `train.py --rollouts-from`.

    python examples/openai_to_rollouts.py requests.jsonl --model assets/tiny-arith \
        --out runs/served/rollouts.jsonl
    python train.py --rollouts-from runs/served/rollouts.jsonl --prompts-per-step 0 ...

Each line of the input: {"prompt_id": int, "prompt": str (or "prompt_ids": [int]), "answer": str,
"response": the server's JSON answer to one request with n completions}. The request must ask for
the sampled tokens' log-probs (`"logprobs": true` in chat completions) at the run's temperature,
and for the tokens as ids (vLLM: `"return_tokens_as_token_ids": true`, tokens "token_id:42");
a token given as text is looked up in the run's tokenizer's vocabulary instead. The choices of one
request are one GRPO group; no reward is written, so the loading run grades them with its own
verifier from text and answer. The log-probs must be the full vocabulary's (log softmax(logits /
temperature), before top-p): vLLM's default.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import logged  # noqa: E402  (the repository's record)


def token_id(token: str, tok) -> int:
    """A served token's id: "token_id:42" -> 42, else the token looked up in `tok`'s vocabulary."""
    if token.startswith("token_id:"):
        return int(token.removeprefix("token_id:"))
    vocab = tok.get_vocab() if tok is not None else {}
    if token not in vocab:
        raise ValueError(f"token {token!r} is not in the tokenizer's vocabulary: ask the server "
                         "for ids (return_tokens_as_token_ids)")
    return vocab[token]


def records(response: dict, *, prompt_id: int, prompt_ids: list, answer: str, meta: dict,
            tok=None, version: int = 0) -> list[dict]:
    """One grpo-rollout/1 row per choice of `response` (chat completions:
    choices[].logprobs.content[] = {token, logprob}; completions: choices[].logprobs.tokens and
    .token_logprobs). `meta`: temperature, top_p, max_new_tokens, model, tokenizer."""
    out = []
    for choice in response["choices"]:
        lp = choice.get("logprobs") or {}
        if "content" in lp:
            tokens = [c["token"] for c in lp["content"]]
            logprobs = [c["logprob"] for c in lp["content"]]
        else:
            tokens, logprobs = lp.get("tokens", []), lp.get("token_logprobs", [])
        text = choice["message"]["content"] if "message" in choice else choice.get("text", "")
        out.append({"format": logged.FORMAT, "prompt_id": prompt_id, "version": version,
                    "prompt_ids": list(prompt_ids),
                    "completion_ids": [token_id(t, tok) for t in tokens],
                    "logprobs": logprobs, "text": text, "answer": answer,
                    "truncated": choice.get("finish_reason") == "length", **meta})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("requests", help="JSONL: prompt_id, prompt or prompt_ids, answer, response")
    ap.add_argument("--model", required=True, help="the run's model directory (its tokenizer)")
    ap.add_argument("--out", required=True, help="the rollouts file to write")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    meta = {"temperature": args.temperature, "top_p": args.top_p,
            "max_new_tokens": args.max_new_tokens, "model": args.model,
            "tokenizer": logged.fingerprint(tok)}
    with open(args.requests) as f, open(args.out, "w") as out:
        for line in f:
            if not line.strip():
                continue
            req = json.loads(line)
            ids = req.get("prompt_ids") or tok.encode(req["prompt"])
            for row in records(req["response"], prompt_id=req["prompt_id"], prompt_ids=ids,
                               answer=str(req["answer"]), meta=meta, tok=tok):
                out.write(json.dumps(row) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
