"""fp8 e4m3 -> bf16 with integer PTX, shared by the Triton kernel
(``kernel._widen``) and the Hopper kernel (``kernel_sm90.fp8_to_bf16``).

Four values a step: PRMT spreads the bytes into 16-bit lanes,
sign-extended, so one shift and one mask put sign, exponent and mantissa
in bf16's fields; a multiply by 2^(127 - 7) rebiases the exponent
(subnormals included). Bit for bit torch's conversion on all 254 finite
codes; the NaN codes (0x7f, 0xff) read as +-480. Triton's own conversion
(e4m3 -> f16 -> bf16) runs on the slow conversion pipe (F2F on sm90).

Operands as ``inline_asm_elementwise`` takes them: constraints
``"=r,=r,r"``, the fp8 values bitcast to uint8, ``pack=4``.
"""

E4M3_TO_BF16_PTX = """
{
.reg .b32 lo, hi, scale;
mov.b32 scale, 0x7B807B80;
prmt.b32 lo, $2, 0, 0x9180;
prmt.b32 hi, $2, 0, 0xB3A2;
shl.b32 lo, lo, 4;
shl.b32 hi, hi, 4;
and.b32 lo, lo, 0x87F087F0;
and.b32 hi, hi, 0x87F087F0;
mul.rn.bf16x2 $0, lo, scale;
mul.rn.bf16x2 $1, hi, scale;
}
"""
