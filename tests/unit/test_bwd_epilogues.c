/* test_bwd_epilogues.c — the backward's GEMM folds (codegen/cg_gemm.c) move a step in
 * time, so each must be refused where the memory plan makes the move unsafe. The training program
 * of tests/emu/models/train_epilogues.ntp has every fold (DGELU_BGRAD, BGRADA, BGRADB) with a plan
 * under which all are safe; here one tensor at a time is placed by hand over the bytes a moved
 * step would write early or read late, and the fold must not be taken; put back, it is taken
 * again. (The plans of the emulator's training tests never make these checks decide, so
 * emu.train_epilogues alone cannot show them.) */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_gen.h"
#include "ntpc.h"
#include "shard.h"

static ntpc_session *compile(void) {
  ntpc_session *s = ntpc_session_new();
  ntpc_set_world(s, 1); /* one rank: the sharded program (and its memory plan) is made */
  ntpc_want_grad(s, true);
  ntpc_want_cuda(s, true);
  if (ntpc_compile_file(s, "tests/emu/models/train_epilogues.ntp") != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    exit(2);
  }
  return s;
}

/* rank 0's CUDA step list generated again from the (edited) program; its step k */
static cg_step step_at(const sh_program *p, int32_t k) {
  cg_module m;
  char err[256];
  cg_step st = {.kind = CG_NONE};
  if (cg_generate(p, 0, &m, err, sizeof err) != 0) {
    fprintf(stderr, "cg_generate: %s\n", err);
    failures++;
    return st;
  }
  st = m.steps[k];
  cg_module_free(&m);
  return st;
}

/* the first GEMM step of rank 0 with epilogue e, or -1 */
static int32_t find(const sh_program *p, cg_epilogue e) {
  cg_module m;
  char err[256];
  int32_t at = -1;
  if (cg_generate(p, 0, &m, err, sizeof err) != 0) return -1;
  for (size_t k = 0; k < p->n_steps && at < 0; k++)
    if (m.steps[k].kind == CG_GEMM && m.steps[k].epilogue == e) at = (int32_t)k;
  cg_module_free(&m);
  return at;
}

static int64_t bytes(const sh_program *p, int32_t t);
static bool share_bytes(const sh_program *p, int32_t a, int32_t b) {
  const sh_tensor *x = &p->tensors[a], *y = &p->tensors[b];
  if (x->persistent != y->persistent || x->rank != y->rank) return false;
  return x->offset < y->offset + bytes(p, b) && y->offset < x->offset + bytes(p, a);
}

static int64_t bytes(const sh_program *p, int32_t t) {
  return box_volume(&p->tensors[t].box) * (int64_t)dtype_bytes(p->tensors[t].dtype);
}

/* an arena tensor of rank 0 live somewhere in steps [from, to] (or, with made, one defined in
 * (from, to]) that is none of not[0..n), shares no byte with them and is at least as large as
 * not[n - 1]: placed over one of those, only the live-range check can refuse the fold */
static int32_t pick(const sh_program *p, int32_t from, int32_t to, bool made, const int32_t *not, int n) {
  for (size_t t = 0; t < p->n_tensors; t++) {
    const sh_tensor *x = &p->tensors[t];
    bool excluded = x->persistent || x->rank != 0 || bytes(p, (int32_t)t) < bytes(p, not[n - 1]) ||
                    (made ? x->def <= from || x->def > to : x->def > to || x->last_use < from);
    for (int i = 0; i < n; i++) excluded |= not[i] == (int32_t)t || (not[i] >= 0 && share_bytes(p, not[i], (int32_t)t));
    if (!excluded) return (int32_t)t;
  }
  return -1;
}

int main(void) {
  ntpc_session *s = compile();
  sh_program *p = (sh_program *)ntpc_sharded(s); /* edited in place, and put back */
  if (!p) {
    fprintf(stderr, "no sharded program\n");
    return 1;
  }

  /* DGELU_BGRAD: the GEMM of step mm runs at step R, the sum_to's result is written at R */
  int32_t R = find(p, CG_EPI_DGELU_BGRAD);
  CHECK(R >= 0);
  if (R >= 0) {
    cg_step cs = step_at(p, R);
    int32_t mm = cs.mm, a = p->steps[mm].op.args[0], db = cs.bias, U = p->tensors[db].def;
    /* a tensor made between the matmul and the act_grad, placed over the GEMM's operand: the
     * delayed GEMM would read it instead */
    int32_t mine[] = {cs.out, cs.aux, a};
    int32_t u = pick(p, mm, R, true, mine, 3);
    CHECK(u >= 0);
    if (u >= 0) {
      int64_t keep = p->tensors[u].offset;
      p->tensors[u].offset = p->tensors[a].offset;
      cg_step moved = step_at(p, R);
      CHECK(moved.kind != CG_GEMM); /* the act_grad is a kernel again */
      CHECK(step_at(p, mm).kind == CG_GEMM && step_at(p, mm).epilogue == CG_EPI_NONE);
      p->tensors[u].offset = keep;
    }
    /* the bias gradient placed over a tensor live between the act_grad and the sum_to: DGELU
     * alone, the sum_to a kernel */
    int32_t not[] = {a, p->steps[mm].op.args[1], cs.aux, cs.out, db};
    int32_t v = pick(p, R, U, false, not, 5);
    CHECK(v >= 0);
    if (v >= 0) {
      int64_t keep = p->tensors[db].offset;
      p->tensors[db].offset = p->tensors[v].offset;
      CHECK(step_at(p, R).epilogue == CG_EPI_DGELU);
      CHECK(step_at(p, U).kind == CG_KERNEL);
      p->tensors[db].offset = keep;
    }
    CHECK(step_at(p, R).epilogue == CG_EPI_DGELU_BGRAD); /* put back: taken again */
  }

  /* BGRADA and BGRADB: the sum_to's result written at the weight-gradient GEMM's step */
  for (cg_epilogue e = CG_EPI_BGRADA; e <= CG_EPI_BGRADB; e++) {
    int32_t g = find(p, e);
    CHECK(g >= 0);
    if (g < 0) continue;
    cg_step cs = step_at(p, g);
    int32_t db = cs.bias, U = p->tensors[db].def;
    int32_t not[] = {p->steps[g].op.args[0], p->steps[g].op.args[1], cs.out, db};
    int32_t v = pick(p, U < g ? U : g, U < g ? g : U, false, not, 4);
    CHECK(v >= 0);
    if (v < 0) continue;
    int64_t keep = p->tensors[db].offset;
    p->tensors[db].offset = p->tensors[v].offset;
    CHECK(step_at(p, g).epilogue == CG_EPI_NONE);
    CHECK(step_at(p, U).kind == CG_KERNEL);
    p->tensors[db].offset = keep;
    CHECK(step_at(p, g).epilogue == e);
  }
  ntpc_session_free(s);
  return check_report("bwd_epilogues");
}
