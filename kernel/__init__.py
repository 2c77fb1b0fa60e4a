"""The fused FP8 e4m3 KV-cache write (`fused_fp8_set_kv_buffer`) and its specification
(`naive_fp8_set_kv_buffer`), with the recipes that name the quantization arithmetic."""

from kernel import backend  # noqa: F401  (must run before triton is imported: picks the interpreter)
from kernel.custom_op import fused_fp8_set_kv_buffer_op  # registers torch.ops.kvfp8.fused_fp8_set_kv_buffer
from kernel.fused import fused_fp8_set_kv_buffer
from kernel.recipe import DEFAULT_RECIPE, NAN_BYTE, RECIPES, Recipe, get_recipe
from kernel.reference import naive_fp8_set_kv_buffer, quantize

__all__ = [
    "DEFAULT_RECIPE", "NAN_BYTE", "RECIPES", "Recipe", "fused_fp8_set_kv_buffer",
    "fused_fp8_set_kv_buffer_op", "get_recipe",
    "naive_fp8_set_kv_buffer", "quantize",
]
