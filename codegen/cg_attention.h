/* cg_attention.h — what attention's forward (cg_attention.c) and backward (cg_attention_grad.c)
 * kernels share: the dims every attention kernel bakes in, the warp kernels' head, and the limit
 * of the tiled kernels. */
#ifndef NTP_CG_ATTENTION_H
#define NTP_CG_ATTENTION_H

#include "cg_emit.h"

/* warps per block of the warp kernels (a warp per output row) */
enum { ATT_WARPS = 4 };
/* the largest head dim of the tiled kernels (their tiles in static shared memory) */
enum { ATT_TILED_MAX_HD = 128 };

typedef enum { CG_ATT_AUTO, CG_ATT_TILED, CG_ATT_GEMM, CG_ATT_WARP } cg_att_kernel;

/* The attributes and shapes every attention kernel bakes in. q [B, S, H, HD], k and v
 * [B, S, KV, HD]; dy: attention_grad's fourth operand (-1 in the forward); y: the step's result. */
typedef struct attn_dims {
  int32_t q, k, v, dy, y;
  long long B, S, H, KV, HD, group, qoff, kvoff;
  bool causal;
  char scale[48];
} attn_dims;

attn_dims cg_attn_dims(gen *g, int32_t step);
/* starts a warp kernel: i64 w the warp's row in [0, rows), int lane */
void cg_attn_warp_head(gen *g, int32_t step, long long rows);

#endif
