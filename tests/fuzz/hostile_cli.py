#!/usr/bin/env python3
"""Hostile invocations of the `moejit` command (issue 22): configs and model folders that are
malformed, deeply nested, huge or of the wrong types, and option values that are not what they
claim. Every invocation must end by itself (no hang), without a signal (no crash), with exit 0, or
exit 2 and one line on stderr of at most 300 characters starting "moejit: ". A config field
mutation that is refused must name a config field.

CI runs a bounded number through tests/python/test_hostile_cli.py; a longer run:
    python3 tests/fuzz/hostile_cli.py --cli build/moejit --iterations 20000 --seed 7
Each failure prints the invocation and, for a file input, where the file was kept.
"""
import argparse
import json
import os
import pathlib
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
MAX_MESSAGE = 300
TIMEOUT_S = 30

# Config fields (moejit JSON names, SPEC.md) and the CLI overrides that set them.
FIELDS = ["experts", "topk", "num_expert_group", "topk_group", "scoring", "topk_method", "renormalize",
          "routed_scaling_factor", "hidden", "moe_intermediate", "activation", "gated", "swiglu_limit",
          "expert_bias", "dtype", "router_dtype", "quant", "ep_size", "ep_rank", "tp_size", "tp_rank",
          "n_shared_experts", "weight_layout"]
NUMBERS = [0, -1, 1, 2, 3, 7, 255, 256, 257, 4096, 2**31 - 1, 2**31, 2**32 + 1, 2**53 + 1, 2**63 - 1, 2**64,
           10**30, -(2**63), 0.5, 2.5, -0.0, 1e-300, 1e308]
TEXTS = ["", " ", "5", " 5", "5 ", "+5", "0x10", "1e3", "-0", "nan", "inf", "-inf", "NaN", "true", "null",
         "bf16", "fp8", "silu", "sigmoid", "\u00e9\u00e8", "a\nb", "\t", "x" * 100000, "9" * 400,
         "1" + "0" * 30, "-9223372036854775809", "18446744073709551616"]


def hostile_value(rng):
    kind = rng.randrange(9)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return rng.choice(TEXTS)
    if kind == 2:
        return None
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return [rng.choice(NUMBERS)] * rng.randrange(4)
    if kind == 5:
        return {"a": rng.choice(NUMBERS)}
    if kind == 6:
        return rng.randint(-10, 10**6)
    if kind == 7:
        return rng.uniform(-1e6, 1e6)
    return "x" * rng.choice([1, 300, 5000])


def raw_json_number(rng):
    """Numbers JSON allows but no double holds, or that only look like integers."""
    return rng.choice(["1e400", "-1e400", "1" * 500, "0.0000000000000000000000001e-400", "1.0", "1e2", "-0"])


def nested(depth):
    return "[" * depth + "]" * depth


def mutate_config(rng, text):
    """A hostile variant of a JSON config's text; returns (text, field or None)."""
    kind = rng.randrange(12)
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
    keys = list(data.keys()) or FIELDS
    field = rng.choice(keys)
    if kind <= 3:  # one field of the wrong value or type
        data[field] = hostile_value(rng)
        return json.dumps(data), field
    if kind == 4:  # a number no double holds, spliced in as text
        data[field] = "@@"
        return json.dumps(data).replace('"@@"', raw_json_number(rng)), field
    if kind == 5:  # a field removed
        data.pop(field, None)
        return json.dumps(data), None
    if kind == 6:  # deep nesting, inside the object or as the whole file
        depth = rng.choice([100, 1000, 100000, 300000])
        if rng.random() < 0.5:
            return nested(depth), None
        data[field] = "@@"
        return json.dumps(data).replace('"@@"', nested(depth)), field
    if kind == 7:  # truncated
        return text[: rng.randrange(len(text) + 1)], None
    if kind == 8:  # random bytes spliced in
        at = rng.randrange(len(text) + 1)
        junk = "".join(chr(rng.randrange(1, 256)) for _ in range(rng.randrange(1, 20)))
        return text[:at] + junk + text[at:], None
    if kind == 9:  # not an object
        return rng.choice(["[]", "null", "3", '"x"', "", " ", "\ufeff{}", "{}"]), None
    if kind == 10:  # unknown or duplicated keys
        extra = '"%s": %s' % (rng.choice([field, "unknown_field", "x" * 300]), json.dumps(hostile_value(rng)))
        return text.rstrip().rstrip("}") + ", " + extra + "}", None
    data[field] = "@@"  # a huge string value
    return json.dumps(data).replace('"@@"', json.dumps("v" * rng.choice([1000, 10**6]))), field


def checkpoint(rng, folder):
    """A tiny Qwen3-MoE checkpoint (config.json, model.safetensors: 4 experts, hidden 64, I 32)
    with one hostile change in the safetensors file: its header length, its JSON header (a
    tensor's dtype, shape or byte range, or the text itself) or its data."""
    config = json.loads((FIXTURES / "hf" / "qwen3-30b-a3b" / "config.json").read_text())
    config.update(hidden_size=64, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_hidden_layers=1)
    (folder / "config.json").write_text(json.dumps(config))
    header, offset = {}, 0
    for e in range(4):
        for name, shape in (("gate_proj", [32, 64]), ("up_proj", [32, 64]), ("down_proj", [64, 32])):
            size = shape[0] * shape[1] * 2
            header[f"model.layers.0.mlp.experts.{e}.{name}.weight"] = {
                "dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
    data = bytes(offset)
    kind = rng.randrange(6)
    name = rng.choice(list(header))
    if kind == 0:
        header[name]["dtype"] = hostile_value(rng) if rng.random() < 0.5 else rng.choice(["F8_E4M3", "I64", "bf16", "F16"])
    elif kind == 1:
        header[name]["shape"] = rng.choice([[], [-1, 64], [2**62, 2**62], [32], [32, 64, 1], "x", [0, 64], [32.5, 64]])
    elif kind == 2:
        start, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = rng.choice([[end, start], [0, 2**63], [-8, end], [start, end + 2], [start],
                                                   [start, 2**64], None, [start + 1, end + 1]])
    elif kind == 3:
        header["__metadata__"] = {"format": hostile_value(rng)}
    text = json.dumps(header).encode()
    if kind == 4:  # the header text cut or spliced with junk
        at = rng.randrange(len(text) + 1)
        text = text[:at] + (bytes(rng.randrange(256) for _ in range(rng.randrange(8))) if rng.random() < 0.5 else b"")
    length = len(text)
    if kind == 5:  # the length field lies
        length = rng.choice([0, 1, 7, length + 1, length - 1, 2**63, 2**64 - 1, 100 << 20, len(text) + len(data) + 8])
    blob = struct.pack("<Q", length % 2**64) + text + data
    if rng.random() < 0.2:  # the data cut short
        blob = blob[: rng.randrange(len(blob) + 1)]
    (folder / "model.safetensors").write_bytes(blob)


def option_name(field):
    return "--" + field.replace("_", "-")


def invocation(rng, work):
    """(argv, field or None, file kept on failure or None)."""
    choice = rng.randrange(12)
    if choice <= 4:  # a config file (moejit JSON or a Hugging Face config.json)
        sources = sorted((FIXTURES / "moejit").glob("*.json")) + sorted((FIXTURES / "hf").glob("*/config.json"))
        text, field = mutate_config(rng, rng.choice(sources).read_text())
        path = work / "config.json"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        if choice == 4:  # the same as a model folder
            return ["dump-source", "--model", str(work), "--stage", "routing"], field, path
        return ["dump-source", "--config", str(path), "--stage", "routing"], field, path
    if choice <= 7:  # an override of the wrong value
        field = rng.choice(FIELDS)
        value = rng.choice(TEXTS + [str(v) for v in NUMBERS])
        preset = rng.choice(["mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-20b"])
        return ["dump-source", "--preset", preset, option_name(field), value, "--stage", "routing"], field, None
    if choice == 8:  # sizes and token counts
        value = rng.choice(TEXTS + [str(v) for v in NUMBERS] + ["512M", "2G", "1K", "0", "10T", "1.5G", "-1M"])
        if rng.random() < 0.5:
            return ["dump-source", "--plan", "--preset", "qwen3-30b-a3b", "--max-tokens", value, "--stage",
                    "routing"], None, None
        return ["cache", "prune", "--max-size", value], None, None
    if choice >= 10:  # a model folder whose checkpoint file is hostile
        checkpoint(rng, work)
        return ["inspect", "--model", str(work)], None, work / "model.safetensors"
    # special files where a config belongs
    path = work / "special"
    kind = rng.randrange(3)
    if kind == 0:
        os.mkfifo(path)
    elif kind == 1:
        path.mkdir()
    else:
        with open(path, "wb") as f:  # sparse: 64 GiB of nothing
            f.truncate(64 << 30)
    return ["dump-source", "--config", str(path), "--stage", "routing"], None, None


def check(result, field, argv, work):
    """'' or what is wrong with one invocation's result (`work`: the case's folder, whose path a
    message may quote and which names no field)."""
    if result.returncode < 0:
        return f"killed by signal {-result.returncode}"
    # `inspect` exits 1 after its report when a layer lacks what the config needs (cli/inspect.h).
    if argv[0] == "inspect" and result.returncode == 1 and result.stdout.startswith("checkpoint ") and not result.stderr:
        return ""
    if result.returncode not in (0, 2):
        return f"exit {result.returncode} (0 or 2 expected): {result.stderr[-400:]!r}"
    if result.returncode == 2:
        message = result.stderr.rstrip("\n")
        if "\n" in message:
            return f"{message.count(chr(10)) + 1} lines on stderr, one expected: {message[:400]!r}"
        if len(message) > MAX_MESSAGE:
            return f"a message of {len(message)} characters (at most {MAX_MESSAGE}): {message[:400]!r}"
        if not message.startswith("moejit: "):
            return f"a message not starting 'moejit: ': {message[:400]!r}"
        said = message.replace(str(work), "")
        if field is not None and not any(name in said for name in FIELDS + [field, "JSON"]):
            return f"a refusal of field {field} that names no field: {message!r}"
    return ""


def run(cli, iterations, seed, keep_dir=None):
    """Runs `iterations` hostile invocations; returns the failures as text lines."""
    rng = random.Random(seed)
    failures = []
    with tempfile.TemporaryDirectory(prefix="moejit-hostile-") as scratch:
        env = dict(os.environ, MOEJIT_CACHE_DIR=str(pathlib.Path(scratch) / "cache"), MOEJIT_LOG="off")
        for i in range(iterations):
            work = pathlib.Path(scratch) / f"case{i}"
            work.mkdir()
            argv, field, kept = invocation(rng, work)
            try:
                result = subprocess.run([str(cli), *argv], capture_output=True, text=True, errors="replace",
                                        timeout=TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
                why = check(result, field, argv, work)
            except subprocess.TimeoutExpired:
                why = f"no exit within {TIMEOUT_S} s (a hang)"
            if why:
                shown = " ".join(a if len(a) < 80 else a[:60] + f"...({len(a)} chars)" for a in argv)
                line = f"case {i} (seed {seed}): moejit {shown}: {why}"
                if kept is not None and keep_dir is not None:
                    target = pathlib.Path(keep_dir) / f"seed{seed}-case{i}-{kept.name}"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(kept, target)
                    line += f" (input kept at {target})"
                failures.append(line)
            shutil.rmtree(work, ignore_errors=True)
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", default=str(ROOT / "build" / "moejit"))
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", default="hostile-failures", help="folder for the inputs of failing cases")
    args = parser.parse_args()
    failures = run(args.cli, args.iterations, args.seed, args.keep)
    for line in failures:
        print(line)
    print(f"{args.iterations} invocations, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
