/* test_launch_order.c — the CUDA backend's launch order (runtime/cuda/launch_order.c) on the training
 * program of examples/byte_gpt.ntp under examples/plans/byte_gpt_mixed8.ntp (8 ranks, every layer
 * its own way), for all ranks in one process and for each rank in its own:
 * - it enqueues exactly what step order does (the collectives, the ranks' launches);
 * - no two steps that it swaps share a byte that either writes (two launches), or any byte (a
 *   launch and a collective), and no two collectives swap: checked here pair by pair on the
 *   footprints' spans, by a rule written again, so a scheduler that lets a conflict pass fails;
 * - it puts compute in flight with more collectives than step order does (rank 0, and overall);
 * - without reordering it is step order.
 * No GPU: the order is host code, decided when the backend is created. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "launch_order.h"
#include "ntpc.h"
#include "session_program.h"

static ntp_program *compile(void) {
  ntpc_session *s = ntpc_session_new();
  ntpc_set_world(s, 0); /* the plan's */
  ntpc_want_grad(s, true);
  ntpc_want_cuda(s, true);
  static const char *dims[] = {"B=2", "S=16", "D=64", "H=8"};
  for (int i = 0; i < 4; i++) ntpc_define_str(s, dims[i]);
  char err[256] = "";
  ntp_program *p = NULL;
  if (ntpc_add_plan_file(s, "examples/plans/byte_gpt_mixed8.ntp") != NTPC_OK ||
      ntpc_compile_file(s, "examples/byte_gpt.ntp") != NTPC_OK || !(p = session_program(s, err, sizeof err))) {
    ntpc_print_diags(s, stderr, 0);
    fprintf(stderr, "%s\n", err);
    exit(2);
  }
  ntpc_session_free(s);
  return p;
}

/* the rule again: a span of a and of b on the same bytes, one of them written (or, with any, either) */
static bool clash(const ntp_footprints *f, int32_t a, int32_t b, bool any) {
  for (size_t i = f->start[a]; i < f->start[a + 1]; i++)
    for (size_t j = f->start[b]; j < f->start[b + 1]; j++) {
      const ntp_span *x = &f->span[i], *y = &f->span[j];
      bool same = x->rank == y->rank && x->persistent == y->persistent && x->lo < y->hi && y->lo < x->hi;
      if (same && x->lo < x->hi && (any || x->write || y->write)) return true;
    }
  return false;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* one process's ranks [lo, hi): the checks above; its overlap counts in now / before */
static void check_ranks(const ntp_program *p, const ntp_footprints *f, int lo, int hi, ntp_overlap_count *now,
                        ntp_overlap_count *before) {
  ntp_launch_order o, s;
  ntp_comm_deps d, ds;
  CHECK(ntp_launch_order_build(p, f, lo, hi, true, &o) == 0);
  CHECK(ntp_launch_order_build(p, f, lo, hi, false, &s) == 0);
  CHECK(o.n == s.n);
  size_t n = o.n < s.n ? o.n : s.n;
  for (size_t k = 1; k < s.n; k++) CHECK(s.step[k - 1] < s.step[k]); /* step order */
  int32_t *sorted = malloc((n + 1) * sizeof *sorted);
  memcpy(sorted, o.step, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cmp_i32);
  CHECK(memcmp(sorted, s.step, n * sizeof *sorted) == 0); /* the same steps */
  free(sorted);
  int swapped = 0, bad = 0;
  for (size_t a = 0; a < n; a++)
    for (size_t b = a + 1; b < n; b++) {
      int32_t x = o.step[a], y = o.step[b]; /* x enqueued first */
      if (x < y) continue;
      swapped++;
      bool cx = p->steps[x].kind == SH_COMM, cy = p->steps[y].kind == SH_COMM;
      if ((cx && cy) || clash(f, x, y, cx || cy)) {
        if (bad++ < 5) fprintf(stderr, "ranks [%d, %d): steps %d and %d swapped, but they conflict\n", lo, hi, y, x);
      }
    }
  CHECK(bad == 0);
  CHECK(swapped > 0);
  CHECK(ntp_comm_deps_build(p, f, o.step, o.n, &d) == 0);
  CHECK(ntp_comm_deps_build(p, f, s.step, s.n, &ds) == 0);
  ntp_overlap_measure(p, &o, &d, now);
  ntp_overlap_measure(p, &s, &ds, before);
  CHECK(now->consumed == before->consumed); /* every consumer still waits; only what runs before it moved */
  ntp_comm_deps_free(&d), ntp_comm_deps_free(&ds);
  ntp_launch_order_free(&o), ntp_launch_order_free(&s);
}

int main(void) {
  ntp_program *p = compile();
  ntp_footprints f;
  CHECK(p->world == 8);
  CHECK(ntp_footprints_build(p, &f) == 0);
  ntp_overlap_count now, before, sum_now = {0}, sum_before = {0};
  for (int r = 0; r < p->world; r++) { /* a process per rank */
    check_ranks(p, &f, r, r + 1, &now, &before);
    printf("rank %d: %d collectives with a consumer, %d with compute in flight (was %d), %d launches between (was %d)\n",
           r, now.consumed, now.overlapped, before.overlapped, now.launches, before.launches);
    if (r == 0) CHECK(now.overlapped > before.overlapped && now.launches > before.launches);
    sum_now.overlapped += now.overlapped, sum_before.overlapped += before.overlapped;
  }
  CHECK(sum_now.overlapped > sum_before.overlapped);
  check_ranks(p, &f, 0, p->world, &now, &before); /* every rank in one process (loopback, NCCL in one process) */
  printf("ranks 0-7: %d pairs with a consumer, %d with compute in flight (was %d)\n", now.consumed, now.overlapped,
         before.overlapped);
  CHECK(now.overlapped > before.overlapped);
  ntp_footprints_free(&f);
  ntp_program_free(p);
  return check_report("launch_order");
}
