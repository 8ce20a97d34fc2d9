/* test_comm_bytes.c — communication the compiler plans equals closed-form formulas in
 * canonical cases: Megatron MLP all-reduce, sequence-parallel reduce-scatter + all-gather,
 * vocabulary-parallel embedding, a degree 8 -> 2 redistribution by slice overlap, and the
 * distributed optimizer's reduce-scatter, parameter gather and state (the memory check with it). */
#include <stdio.h>
#include <string.h>

#include "ntpc.h"
#include "session_program.h"
#include "ntprt.h"
#include "shard.h"

#include "check.h"


typedef struct totals {
  long long elems[8], steps[8], sent, received; /* per comm kind */
} totals;

static ntpc_session *compile(const char *src) {
  ntpc_session *s = ntpc_session_new();
  ntpc_select_plan(s, "p");
  ntpc_set_world(s, 0);
  if (ntpc_compile_string(s, "case.ntp", src) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    failures++;
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

/* Sums the communication of one layer (or of everything when layer is NULL). */
static totals count(const sh_program *p, const char *layer) {
  totals t = {0};
  for (size_t i = 0; i < p->n_steps; i++) {
    const sh_step *st = &p->steps[i];
    if (st->kind != SH_COMM || st->comm == COMM_LOCAL_COPY) continue;
    if (layer && (st->layer < 0 || strcmp(p->global->layers[st->layer].name, layer) != 0)) continue;
    t.elems[st->comm] += st->elems;
    t.steps[st->comm]++;
    for (int r = 0; r < st->nranks; r++) {
      t.sent += st->bytes_out[r];
      t.received += st->bytes_in[r];
    }
  }
  return t;
}

/* The sharded run must also agree with the unsharded one: the byte counts describe a program that works. */
static void check_equal(ntpc_session *s) {
  ntp_cpu_result ref, got;
  char err[256];
  ntp_program *p = session_program(s, err, sizeof err);
  CHECKF(p != NULL, "%s", err);
  if (!p) return;
  CHECKF(ntp_cpu_run(&p->global, 3, 0, &ref, err, sizeof err) == 0, "%s", err);
  CHECKF(ntp_sim_run(p, 3, &got, err, sizeof err) == 0, "%s", err);
  ntp_program_free(p);
  for (size_t o = 0; o < ref.n_outputs; o++)
    CHECKF(ntp_max_rel_error(&got.outputs[o], &ref.outputs[o]) < 1e-5, "output %zu differs", o);
  ntp_cpu_result_free(&ref);
  ntp_cpu_result_free(&got);
}

/* A Megatron MLP at degree t moves one all-reduce of B*S*D elements per forward. */
static void megatron_mlp(int world, int t) {
  char src[512];
  const long long B = 4, S = 6, D = 16;
  snprintf(src, sizeof src,
           "model m { dim B = %lld, S = %lld, D = %lld, F = 64; dtype fp32; input x : fp32[B, S, D];\n"
           "  output y = ffn: mlp(x, hidden = F, act = gelu); }\n"
           "plan p for m { world %d; * tp %d; }\n",
           B, S, D, world, t);
  ntpc_session *s = compile(src);
  if (!s) return;
  totals c = count(ntpc_sharded(s), NULL);
  long long N = B * S * D, groups = world / t;
  CHECKF(c.elems[COMM_ALL_REDUCE] == (t > 1 ? N : 0), "world %d tp %d: all-reduce elems %lld, want %lld", world, t,
        c.elems[COMM_ALL_REDUCE], N);
  CHECKF(c.steps[COMM_ALL_REDUCE] == (t > 1 ? groups : 0), "one all-reduce per group");
  /* ring all-reduce: each rank sends 2 (t-1)/t of its group's tensor (N / groups elements, fp32) */
  long long want = t > 1 ? world * (2 * (t - 1) * (N / groups) * 4 / t) : 0;
  CHECKF(c.sent == want, "world %d tp %d: sent %lld bytes, want %lld", world, t, c.sent, want);
  long long other = c.elems[COMM_ALL_GATHER] + c.elems[COMM_SEND_RECV] + c.elems[COMM_ALL_TO_ALL] +
                    c.elems[COMM_REDUCE_SCATTER];
  CHECKF(other == 0, "no other communication (%lld elems)", other);
  check_equal(s);
  ntpc_session_free(s);
}

/* Sequence parallelism: reduce-scatter instead of all-reduce, and an all-gather before the next layer. */
static void sequence_parallel(void) {
  const long long B = 2, S = 6, D = 8, t = 4;
  char src[512];
  snprintf(src, sizeof src,
           "model m { dim B = %lld, S = %lld, D = %lld, F = 32; dtype fp32; input x : fp32[B, S, D];\n"
           "  h = f1: mlp(x, hidden = F, act = relu);\n"
           "  output y = f2: mlp(h, hidden = F, act = relu); }\n"
           "plan p for m { world %lld; * tp %lld, sequence_parallel; }\n",
           B, S, D, t, t);
  ntpc_session *s = compile(src);
  if (!s) return;
  long long N = B * S * D;
  totals f1 = count(ntpc_sharded(s), "f1"), f2 = count(ntpc_sharded(s), "f2");
  CHECKF(f1.elems[COMM_REDUCE_SCATTER] == N, "f1 reduce-scatter %lld elems, want %lld", f1.elems[COMM_REDUCE_SCATTER], N);
  CHECKF(f1.elems[COMM_ALL_REDUCE] == 0, "no all-reduce under sequence parallelism");
  CHECKF(f2.elems[COMM_ALL_GATHER] == N, "f2 all-gathers its input: %lld elems, want %lld", f2.elems[COMM_ALL_GATHER], N);
  /* all-gather: every rank receives what it does not hold, (t - 1) * N elements in all;
   * ring reduce-scatter: each rank receives (t - 1) / t of the tensor */
  long long want = (t - 1) * N * 4 + t * (N * 4 * (t - 1) / t);
  CHECKF(f2.received == want, "f2 received %lld bytes, want %lld", f2.received, want);
  check_equal(s);
  ntpc_session_free(s);
}

/* The vocabulary-parallel embedding sums the lookups: one all-reduce of B*S*D. */
static void embedding(void) {
  const long long B = 3, S = 5, D = 8, V = 37;
  char src[512];
  snprintf(src, sizeof src,
           "model m { dim B = %lld, S = %lld, D = %lld, V = %lld; dtype fp32; input tok : i32[B, S];\n"
           "  output x = embed: embedding(tok, vocab = V, dim = D); }\n"
           "plan p for m { world 8; embed tp 8; }\n",
           B, S, D, V);
  ntpc_session *s = compile(src);
  if (!s) return;
  totals c = count(ntpc_sharded(s), "embed");
  CHECKF(c.elems[COMM_ALL_REDUCE] == B * S * D, "embedding all-reduce %lld elems", c.elems[COMM_ALL_REDUCE]);
  /* 37 rows over 8 ranks: 5 on the first five, 4 on the rest */
  const sh_program *p = ntpc_sharded(s);
  int rows5 = 0, rows4 = 0;
  for (size_t i = 0; i < p->n_tensors; i++) {
    const sh_tensor *t = &p->tensors[i];
    if (t->persistent && t->name && strcmp(t->name, "embed.wte") == 0) {
      long long n = t->box.hi[0] - t->box.lo[0];
      rows5 += n == 5;
      rows4 += n == 4;
    }
  }
  CHECKF(rows5 == 5 && rows4 == 3, "uneven vocabulary split: %d ranks with 5 rows, %d with 4", rows5, rows4);
  check_equal(s);
  ntpc_session_free(s);
}

/* Degree 8 -> 2: l1 leaves each of 8 ranks a column slice of every row; l2 (four groups
 * of 2) needs its group's rows whole. Each rank receives its rows of every column slice
 * it does not hold: rows_g * S * (N - n_r) elements. */
static void redistribution_8_to_2(void) {
  const long long B = 8, S = 3, D = 16, N = 43;
  char src[512];
  snprintf(src, sizeof src,
           "model m { dim B = %lld, S = %lld, D = %lld, N = %lld; dtype fp32; input x : fp32[B, S, D];\n"
           "  h = l1: linear(x, out = N);\n"
           "  output y = l2: linear(h, out = D); }\n"
           "plan p for m { world 8; l1 tp 8; l2 tp 2; }\n",
           B, S, D, N);
  ntpc_session *s = compile(src);
  if (!s) return;
  const sh_program *p = ntpc_sharded(s);
  long long want = 0;
  for (int r = 0; r < 8; r++) {
    int64_t lo, hi;
    split_range(N, 8, r, &lo, &hi);
    want += (B / 4) * S * (N - (hi - lo)) * 4;
  }
  totals c = count(p, "l2");
  CHECKF(c.received == want, "redistribution received %lld bytes, slice overlap says %lld", c.received, want);
  CHECKF(c.sent == want, "sent %lld bytes, want %lld", c.sent, want);
  check_equal(s);
  ntpc_session_free(s);
}

/* The distributed optimizer on n data-parallel replicas of a linear layer (W: D x F, fp32, P bytes):
 * the sync is a reduce-scatter, each rank sending and receiving (n - 1 + K - 1) / n of P (a ring
 * reduce-scatter, then each part to its K - 1 further owners); each replica gathers the parts it
 * does not own, (n - K) / n of P; the state (12 bytes an element) is K / n of the weight's. */
static void zero_bytes(int n, int zero, int k) {
  char src[512];
  const long long D = 16, F = 24, P = D * F * 4;
  snprintf(src, sizeof src,
           "model m { dim B = %d, D = %lld, F = %lld; dtype fp32; input x : fp32[B, D]; input t : i32[B];\n"
           "  h = f: linear(x, out = F, bias = true); output loss = cross_entropy(h, t); }\n"
           "plan p for m { world %d; * tp 1; optimizer zero %d redundancy %d; }\n",
           2 * n, D, F, n, zero, k);
  ntpc_session *s = ntpc_session_new();
  ntpc_select_plan(s, "p");
  ntpc_set_world(s, 0);
  ntpc_want_grad(s, true);
  if (ntpc_compile_string(s, "zero.ntp", src) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    failures++;
    ntpc_session_free(s);
    return;
  }
  const sh_program *p = ntpc_sharded(s);
  long long sync_out = 0, gather_in = 0, state = 0, syncs = 0;
  for (size_t i = 0; i < p->n_steps; i++) {
    const sh_step *st = &p->steps[i];
    if (st->kind != SH_COMM || !st->why) continue;
    bool sy = !strncmp(st->why, "gradient sync", 13), ga = !strncmp(st->why, "parameter gather", 16);
    for (int r = 0; r < st->nranks && (sy || ga); r++)
      if (st->ranks[r] == 0) sync_out += sy ? st->bytes_out[r] : 0, gather_in += ga ? st->bytes_in[r] : 0;
    syncs += sy;
  }
  for (size_t i = 0; i < p->n_tensors; i++) /* rank 0's weight state: its persistent slices of W */
    if (p->tensors[i].persistent && p->tensors[i].rank == 0 && p->tensors[i].init_value >= 0 &&
        !strcmp(p->global->values[p->tensors[i].init_value].name, "f.w"))
      state += 12 * box_volume(&p->tensors[i].init_box);
  long long Pb = P + F * 4; /* the weight and its bias */
  CHECKF(syncs == (zero == 2 ? 2 : 1), "zero %d: %lld sync steps (one per parameter with ZeRO-2)", zero, syncs);
  CHECKF(sync_out == Pb * (n - 1 + k - 1) / n, "zero %d, %d replicas, K %d: rank 0 sends %lld in the sync, want %lld", zero,
        n, k, sync_out, Pb * (n - 1 + k - 1) / n);
  CHECKF(gather_in == Pb * (n - k) / n, "zero %d, %d replicas, K %d: rank 0 gathers %lld, want %lld", zero, n, k,
        gather_in, Pb * (n - k) / n);
  CHECKF(state == 12 * (D * F) * k / n, "%d replicas, K %d: rank 0 keeps %lld bytes of W's state, want %lld", n, k,
        state, 12 * (D * F) * k / n);
  /* the memory check catches two tensors of one rank alive together at one place */
  char why[256];
  sh_program *q = (sh_program *)p;
  int32_t a = -1, b = -1;
  for (size_t i = 0; i < q->n_tensors && b < 0; i++) {
    const sh_tensor *t = &q->tensors[i];
    if (t->persistent || t->def < 0 || t->rank != 0) continue;
    if (a < 0) a = (int32_t)i;
    else if (t->def <= q->tensors[a].last_use && t->offset != q->tensors[a].offset) b = (int32_t)i;
  }
  CHECKF(sh_check_memory(q, why, sizeof why), "the memory plan is sound: %s", why);
  CHECKF(b >= 0, "two tensors of rank 0 alive together at different places%s", "");
  if (b >= 0) {
    int64_t keep = q->tensors[b].offset;
    q->tensors[b].offset = q->tensors[a].offset;
    CHECKF(!sh_check_memory(q, why, sizeof why), "the memory check misses tensors t%d and t%d at one place", a, b);
    q->tensors[b].offset = keep;
  }
  ntpc_session_free(s);
}

int main(void) {
  zero_bytes(4, 1, 1);
  zero_bytes(4, 2, 2);
  zero_bytes(3, 1, 2);
  zero_bytes(8, 2, 3);
  megatron_mlp(2, 2);
  megatron_mlp(4, 4);
  megatron_mlp(3, 3);
  megatron_mlp(8, 4);
  megatron_mlp(8, 8);
  megatron_mlp(6, 1);
  sequence_parallel();
  embedding();
  redistribution_8_to_2();
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  puts("comm bytes: all checks passed");
  return 0;
}
