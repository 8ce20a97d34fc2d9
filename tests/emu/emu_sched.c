/* emu_sched.c — CUDA threads as fibers: one fiber per thread of a block, each run until it
 * reaches a barrier, a warp exchange or its end; a barrier opens only when every thread of
 * the block (or every lane the exchange names) has arrived. Whatever cannot complete on a
 * GPU is an error naming the kernel: a __syncthreads that part of the block never reaches,
 * an exchange naming a lane that has returned, threads waiting at different barriers.
 * The order in which runnable threads (and blocks) run is a parameter, so the race check can
 * run a launch again in another order. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu.h"

enum { STACK_BYTES = 128 << 10, MAX_THREADS = 1024 };
enum { RUNNABLE, AT_SYNC, AT_EXCHANGE, DONE };

typedef struct fiber {
  void *sp;            /* saved stack pointer while switched out */
  unsigned char *stack; /* STACK_BYTES above a guard page */
  int state;
  ntp_emu_thread_view view;
  unsigned mask;       /* the exchange it waits in */
  uint64_t value, result;
  int src;
  bool is_sync;        /* __syncwarp rather than a value exchange */
} fiber;

/* ---- context switch (x86-64 System V: callee-saved registers, MXCSR and x87 control word) ---- */
#if defined(__x86_64__)
void ntp_emu_switch(void **save_sp, void *to_sp);
void ntp_emu_trampoline(void);
__asm__(".text\n"
        ".globl ntp_emu_switch\n.hidden ntp_emu_switch\n.type ntp_emu_switch,@function\n"
        "ntp_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size ntp_emu_switch, .-ntp_emu_switch\n"
        ".globl ntp_emu_trampoline\n.hidden ntp_emu_trampoline\n.type ntp_emu_trampoline,@function\n"
        "ntp_emu_trampoline:\n  callq *%r13\n  ud2\n"
        ".size ntp_emu_trampoline, .-ntp_emu_trampoline\n");
#else
#error "the emulated GPU's fibers are written for x86-64"
#endif

static struct {
  ntp_emu_services svc;
  const ntp_emu_kernel *k;
  void **args;
  fiber fib[MAX_THREADS];
  int nthreads;
  void *sched_sp;
  fiber *cur;
  bool failed;
  sigjmp_buf fault_env;
  volatile sig_atomic_t in_kernel;
  unsigned long long block_linear;
} S;

static void yield_to_scheduler(void) { ntp_emu_switch(&S.cur->sp, S.sched_sp); }

static void fiber_main(void) {
  S.k->invoke(S.args);
  S.cur->state = DONE;
  yield_to_scheduler();
  abort(); /* a finished fiber is never resumed */
}

static void fiber_start(fiber *f) {
  uint64_t *top = (uint64_t *)(f->stack + STACK_BYTES);
  uint64_t *sp = top - 8;
  uint32_t ctl[2];
  __asm__ volatile("stmxcsr %0\n fnstcw %1" : "=m"(ctl[0]), "=m"(ctl[1]));
  memcpy(&sp[0], ctl, 8);
  sp[1] = 0;                          /* r15 */
  sp[2] = 0;                          /* r14 */
  sp[3] = (uint64_t)(uintptr_t)fiber_main; /* r13: what the trampoline calls */
  sp[4] = 0;                          /* r12 */
  sp[5] = 0;                          /* rbx */
  sp[6] = 0;                          /* rbp */
  sp[7] = (uint64_t)(uintptr_t)ntp_emu_trampoline;
  f->sp = sp;
  f->state = RUNNABLE;
}

/* ---- services the kernel calls ----------------------------------------------------------- */

static void svc_syncthreads(void) {
  S.cur->state = AT_SYNC;
  yield_to_scheduler();
}

static uint64_t svc_exchange(unsigned mask, uint64_t value, int src) {
  fiber *f = S.cur;
  f->mask = mask;
  f->value = value;
  f->src = src;
  f->is_sync = false;
  f->state = AT_EXCHANGE;
  yield_to_scheduler();
  return f->result;
}

static void svc_syncwarp(unsigned mask) {
  fiber *f = S.cur;
  f->mask = mask;
  f->src = -1;
  f->is_sync = true;
  f->state = AT_EXCHANGE;
  yield_to_scheduler();
}

static void svc_trap(const char *what) {
  emu_fail("kernel %s: %s in thread %u of block %llu", S.k->name, what, S.cur->view.tid.x, S.block_linear);
  S.failed = true;
  S.cur->state = DONE;
  yield_to_scheduler();
  abort();
}

/* ---- faults: guard pages and stray pointers end the launch, not the process ---------------- */

static void on_fault(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  if (S.in_kernel) {
    S.in_kernel = 0;
    const void *a = si->si_addr;
    emu_alloc *near = emu_near(a);
    if (near) {
      long long d = (const unsigned char *)a >= near->base + near->size
                        ? (long long)((const unsigned char *)a - (near->base + near->size))
                        : -(long long)(near->base - (const unsigned char *)a);
      emu_fail("kernel %s: out-of-bounds access at %p, %lld bytes %s a %zu-byte allocation (thread %u of block %llu)",
               S.k->name, a, d < 0 ? -d : d, d < 0 ? "before" : "past the end of", near->size,
               S.cur ? S.cur->view.tid.x : 0u, S.block_linear);
    } else {
      emu_fail("kernel %s: invalid memory access at %p (%s; thread %u of block %llu)", S.k->name, a,
               sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", S.cur ? S.cur->view.tid.x : 0u, S.block_linear);
    }
    siglongjmp(S.fault_env, 1);
  }
  signal(sig, SIG_DFL); /* not ours: the default action */
  raise(sig);
}

static int setup(void) {
  static bool ready;
  if (ready) return 0;
  for (int i = 0; i < MAX_THREADS; i++) {
    unsigned char *m = mmap(NULL, STACK_BYTES + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      emu_fail("cannot map fiber stacks");
      return -1;
    }
    mprotect(m, 4096, PROT_NONE); /* a stack overflow faults instead of corrupting */
    S.fib[i].stack = m + 4096;
  }
  static unsigned char altstack[64 << 10];
  stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
  sigaltstack(&ss, NULL);
  struct sigaction sa = {0};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
  S.svc.abi = NTP_EMU_ABI;
  S.svc.syncthreads = svc_syncthreads;
  S.svc.exchange = svc_exchange;
  S.svc.syncwarp = svc_syncwarp;
  S.svc.trap = svc_trap;
  ready = true;
  return 0;
}

const ntp_emu_services *emu_services(void) {
  return setup() == 0 ? &S.svc : NULL;
}

/* ---- one block ---------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* order[i] for i < n: identity (0), reversed (1), or a permutation drawn from seed */
static void make_order(int *order, int n, uint64_t mode, uint64_t salt) {
  for (int i = 0; i < n; i++) order[i] = mode == 1 ? n - 1 - i : i;
  if (mode > 1) {
    uint64_t s = mode ^ (salt * 0x9E3779B97F4A7C15ull);
    for (int i = n - 1; i > 0; i--) {
      int j = (int)(splitmix(&s) % (uint64_t)(i + 1));
      int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
}

/* Opens the exchanges of warp w whose lanes have all arrived; 1 if one opened, -1 on error. */
static int release_warp(int w) {
  int lo = w * 32, hi = lo + 32 < S.nthreads ? lo + 32 : S.nthreads;
  bool opened = false;
  for (int i = lo; i < hi; i++) {
    fiber *f = &S.fib[i];
    if (f->state != AT_EXCHANGE) continue;
    int lane = i - lo;
    if (!(f->mask & (1u << lane))) {
      emu_fail("kernel %s: lane %d calls a warp intrinsic with mask 0x%08x, which does not include it (block %llu)",
               S.k->name, lane, f->mask, S.block_linear);
      return -1;
    }
    bool ready = true;
    for (int l = 0; l < 32 && ready; l++) {
      if (!(f->mask & (1u << l))) continue;
      if (lo + l >= hi) {
        emu_fail("kernel %s: a warp intrinsic names lane %d of warp %d, which does not exist (blockDim.x = %d)",
                 S.k->name, l, w, S.nthreads);
        return -1;
      }
      fiber *g = &S.fib[lo + l];
      if (g->state == DONE) {
        emu_fail("kernel %s: lane %d of warp %d waits in a warp exchange (mask 0x%08x) that names lane %d, which has "
                 "returned (block %llu)",
                 S.k->name, lane, w, f->mask, l, S.block_linear);
        return -1;
      }
      ready = g->state == AT_EXCHANGE;
    }
    if (!ready) continue;
    /* every lane of the mask is here: each gets its source's value */
    for (int l = 0; l < 32; l++) {
      if (!(f->mask & (1u << l))) continue;
      fiber *g = &S.fib[lo + l];
      if (g->mask != f->mask || g->is_sync != f->is_sync) {
        emu_fail("kernel %s: lanes %d and %d of warp %d meet in different warp intrinsics (masks 0x%08x, 0x%08x)",
                 S.k->name, lane, l, w, f->mask, g->mask);
        return -1;
      }
    }
    for (int l = 0; l < 32; l++) {
      if (!(f->mask & (1u << l))) continue;
      fiber *g = &S.fib[lo + l];
      if (!g->is_sync) {
        if (g->src >= 0 && g->src < 32 && !(f->mask & (1u << g->src))) {
          emu_fail("kernel %s: lane %d of warp %d reads lane %d, outside the exchange's mask 0x%08x", S.k->name, l, w,
                   g->src, f->mask);
          return -1;
        }
        g->result = g->src >= 0 && g->src < 32 ? S.fib[lo + g->src].value : g->value;
      }
    }
    for (int l = 0; l < 32; l++)
      if (f->mask & (1u << l)) S.fib[lo + l].state = RUNNABLE;
    opened = true;
  }
  return opened ? 1 : 0;
}

static int run_block(int *order, uint64_t mode) {
  int n = S.nthreads;
  for (int i = 0; i < n; i++) {
    fiber *f = &S.fib[i];
    unsigned bx = S.svc.block_dim.x, by = S.svc.block_dim.y;
    f->view = (ntp_emu_thread_view){{(unsigned)i % bx, (unsigned)i / bx % by, (unsigned)i / (bx * by)},
                                    (unsigned)i % 32, (unsigned)i / 32};
    fiber_start(f);
  }
  make_order(order, n, mode, S.block_linear + 1);
  for (;;) {
    for (int k = 0; k < n; k++) {
      fiber *f = &S.fib[order[k]];
      if (f->state != RUNNABLE) continue;
      S.cur = f;
      S.svc.cur = &f->view;
      ntp_emu_switch(&S.sched_sp, f->sp);
      if (S.failed) return -1;
    }
    int done = 0, sync = 0, xch = 0;
    for (int i = 0; i < n; i++) {
      done += S.fib[i].state == DONE;
      sync += S.fib[i].state == AT_SYNC;
      xch += S.fib[i].state == AT_EXCHANGE;
    }
    if (done == n) return 0;
    bool opened = false;
    for (int w = 0; xch && w < (n + 31) / 32; w++) {
      int r = release_warp(w);
      if (r < 0) return -1;
      opened |= r > 0;
    }
    if (opened) continue;
    if (sync + done == n) {
      if (done) {
        emu_fail("kernel %s: __syncthreads reached by %d of the %d threads of block %llu (the other %d returned "
                 "before it)",
                 S.k->name, sync, n, S.block_linear, done);
        return -1;
      }
      for (int i = 0; i < n; i++) S.fib[i].state = RUNNABLE;
      continue;
    }
    emu_fail("kernel %s: block %llu cannot make progress: %d threads wait at __syncthreads, %d in warp exchanges that "
             "cannot complete, %d returned",
             S.k->name, S.block_linear, sync, xch, done);
    return -1;
  }
}

static unsigned long long gcd(unsigned long long a, unsigned long long b) {
  while (b) {
    unsigned long long t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int emu_run_grid(const ntp_emu_kernel *k, ntp_emu_dim grid, ntp_emu_dim block, void **args, uint64_t mode) {
  if (setup() != 0) return -1;
  S.k = k;
  S.args = args;
  S.failed = false;
  S.nthreads = (int)(block.x * block.y * block.z);
  S.svc.block_dim = block;
  S.svc.grid_dim = grid;
  unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
  static int order[MAX_THREADS];
  unsigned long long stride = nblocks > 1 ? (mode | 1) % nblocks : 1; /* coprime to nblocks: a permutation */
  while (nblocks > 1 && gcd(stride, nblocks) != 1) stride++;
  if (sigsetjmp(S.fault_env, 1)) {
    S.cur = NULL;
    return -1;
  }
  S.in_kernel = 1;
  for (unsigned long long b = 0; b < nblocks; b++) {
    /* the block order: forward, reversed, or a seeded stride walk */
    unsigned long long lin = b;
    if (mode == 1) lin = nblocks - 1 - b;
    else if (mode > 1) lin = (b * stride + (mode >> 8)) % nblocks;
    S.block_linear = lin;
    S.svc.block_idx = (ntp_emu_dim){(unsigned)(lin % grid.x), (unsigned)(lin / grid.x % grid.y),
                                    (unsigned)(lin / ((unsigned long long)grid.x * grid.y))};
    if (run_block(order, mode) != 0) {
      S.in_kernel = 0;
      S.cur = NULL;
      return -1;
    }
  }
  S.in_kernel = 0;
  S.cur = NULL;
  return 0;
}
