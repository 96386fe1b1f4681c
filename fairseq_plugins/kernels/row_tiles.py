"""What the coefficient kernels share (``dynamic_coefficients``, ``mhc_coefficients``): one
tile of a row and of the maps' rows that its products read."""
import triton
import triton.language as tl


@triton.jit
def row_tile(x_row, w_ptr, width, j, j_mask, start, BLOCK: tl.constexpr, ACC: tl.constexpr):
    """Columns ``start`` .. ``start + BLOCK`` of the row at ``x_row`` and of the maps' rows
    ``j`` (row-major, ``width`` columns; ``j_mask`` the rows that exist): (the columns c, their
    mask, x BLOCK, w J x BLOCK), zero past the width and in the missing rows, in ``ACC``."""
    c = start + tl.arange(0, BLOCK)
    c_mask = c < width
    x = tl.load(x_row + c, mask=c_mask, other=0.0).to(ACC)
    w = tl.load(w_ptr + j[:, None] * width + c[None, :],
                mask=j_mask[:, None] & c_mask[None, :], other=0.0).to(ACC)
    return c, c_mask, x, w
