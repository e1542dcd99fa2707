"""Calls the moejit C ABI from Python with ctypes (no torch needed to load the library).

    python3 examples/ctypes_example.py build/libmoejit.so

It creates a layer (compiling or loading its kernels) and queries the workspace; with torch and
a GPU present it also runs one forward on random bf16 tensors.
"""
import ctypes
import sys


class Inputs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "hidden", "router_logits", "w13", "w2", "e_score_correction_bias", "w13_scale", "w2_scale",
        "input_smooth", "act_smooth", "residual", "w13_bias", "w2_bias", "gate_weight", "gate_bias")]


def main(path):
    lib = ctypes.CDLL(path)
    lib.moejit_last_error.restype = ctypes.c_char_p
    lib.moejit_layer_config_json.restype = ctypes.c_char_p
    layer = ctypes.c_void_p()
    rc = lib.moejit_layer_create(b"qwen3-30b-a3b", None, ctypes.byref(layer))
    if rc != 0:
        print(f"moejit_layer_create returned {rc}: {lib.moejit_last_error().decode()}")
        return rc
    print("layer:", lib.moejit_layer_config_json(layer).decode())
    tokens = 8
    workspace = ctypes.c_size_t()
    lib.moejit_layer_workspace_bytes(layer, ctypes.c_int64(tokens), ctypes.byref(workspace))
    print("workspace bytes for", tokens, "tokens:", workspace.value)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        e, h, i = 128, 2048, 768
        bf16 = dict(dtype=torch.bfloat16, device="cuda")
        hidden = torch.randn(tokens, h, **bf16)
        logits = torch.randn(tokens, e, **bf16)
        w13 = torch.randn(e, 2 * i, h, **bf16) / h ** 0.5
        w2 = torch.randn(e, h, i, **bf16) / i ** 0.5
        out = torch.empty(tokens, h, **bf16)
        ws = torch.empty(workspace.value, dtype=torch.uint8, device="cuda")
        inputs = Inputs(hidden=hidden.data_ptr(), router_logits=logits.data_ptr(), w13=w13.data_ptr(),
                        w2=w2.data_ptr())
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = lib.moejit_layer_forward(layer, stream, ctypes.c_int64(tokens), ctypes.byref(inputs),
                                      ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(ws.data_ptr()),
                                      ctypes.c_size_t(workspace.value))
        torch.cuda.synchronize()
        print("forward rc", rc, "out norm", out.float().norm().item())
    lib.moejit_layer_destroy(layer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/libmoejit.so"))
