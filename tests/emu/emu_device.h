/* emu_device.h — the device side of the emulated GPU: what a CUDA kernel source needs in
 * order to compile with the host C++ compiler and run on the emulator's scheduler.
 *
 * The emulated NVRTC force-includes this header, compiles the source as C++17 with IEEE
 * single rounding (-ffp-contract=off, no fast math) and appends a kernel table
 * (NTP_EMU_KERNEL). Every CUDA thread is a fiber of the runtime: threadIdx reads the running
 * fiber's view, __syncthreads() and the warp intrinsics yield to the block scheduler, which
 * resumes threads only when the whole block (or warp) has arrived. __shared__ arrays are
 * static: the blocks of a launch run one after another, so each block sees its own
 * contents (and whatever the previous block left, as uninitialised shared memory may hold).
 * __CUDA_ARCH__ stays undefined, so sources keep inline PTX behind #ifdef __CUDA_ARCH__. */
#ifndef NTP_EMU_DEVICE_H
#define NTP_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "emu_abi.h"

static const ntp_emu_services *ntp_emu_s;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static

#define threadIdx (ntp_emu_s->cur->tid)
#define blockIdx (ntp_emu_s->block_idx)
#define blockDim (ntp_emu_s->block_dim)
#define gridDim (ntp_emu_s->grid_dim)
#define warpSize 32

static inline void __syncthreads() { ntp_emu_s->syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { ntp_emu_s->syncwarp(mask); }
static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline void __trap() { ntp_emu_s->trap("__trap()"); }

/* ---- bit casts and correctly rounded arithmetic ------------------------------------------ */
static __forceinline__ float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static __forceinline__ unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static __forceinline__ float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static __forceinline__ int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static __forceinline__ float __fadd_rn(float a, float b) { return a + b; }
static __forceinline__ float __fsub_rn(float a, float b) { return a - b; }
static __forceinline__ float __fmul_rn(float a, float b) { return a * b; }
static __forceinline__ float __fdiv_rn(float a, float b) { return a / b; }
static __forceinline__ float __frcp_rn(float a) { return 1.0f / a; }
static __forceinline__ float __fsqrt_rn(float a) { return sqrtf(a); }
static __forceinline__ float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static __forceinline__ float rsqrtf(float a) { return 1.0f / sqrtf(a); }

/* ---- warp exchange --------------------------------------------------------------------- */
template <typename T> static inline T ntp_emu_xch(unsigned mask, T v, int src) {
  static_assert(sizeof(T) <= 8, "warp exchange of more than 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  bits = ntp_emu_s->exchange(mask, bits, src);
  T r;
  memcpy(&r, &bits, sizeof r);
  return r;
}
static inline int ntp_emu_lane() { return (int)ntp_emu_s->cur->lane; }
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  int base = ntp_emu_lane() & ~(width - 1);
  return ntp_emu_xch(mask, v, base + (src & (width - 1)));
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
  int lane = ntp_emu_lane(), src = lane ^ m;
  return ntp_emu_xch(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : -1);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  int lane = ntp_emu_lane(), src = lane + (int)d;
  return ntp_emu_xch(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : -1);
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  int lane = ntp_emu_lane(), src = lane - (int)d;
  return ntp_emu_xch(mask, v, src >= (lane & ~(width - 1)) ? src : -1);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  unsigned r = 0;
  for (int l = 0; l < 32; l++)
    if (mask & (1u << l)) r |= ntp_emu_xch(mask, pred ? 1u : 0u, l) << l;
  return r;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == (mask & __ballot_sync(mask, 1)); }

/* ---- atomics: fibers of one launch never run at the same time ---------------------------- */
template <typename T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> static inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <typename T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <typename T> static inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> static inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }

/* ---- the kernel table that the emulated NVRTC appends --------------------------------------- */
template <typename F> struct ntp_emu_sig;
template <typename... A> struct ntp_emu_sig<void (*)(A...)> {
  template <std::size_t... I> static void call(void (*f)(A...), void **args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(args[I])...);
  }
  static void invoke(void (*f)(A...), void **args) { call(f, args, std::index_sequence_for<A...>{}); }
  static void fill(ntp_emu_kernel *k) {
    static_assert(sizeof...(A) <= 16, "more than 16 kernel parameters");
    k->nargs = (int)sizeof...(A);
    int i = 0;
    ((k->arg_size[i] = sizeof(A), k->pointer_args |= std::is_pointer<std::remove_reference_t<A>>::value ? 1u << i : 0u,
      i++),
     ...);
    (void)i;
  }
};
#define NTP_EMU_KERNEL(fn, bound)                                                        \
  do {                                                                                  \
    ntp_emu_kernel *k_ = &ntp_emu_table[ntp_emu_n++];                                   \
    *k_ = ntp_emu_kernel{};                                                             \
    k_->name = #fn;                                                                     \
    k_->max_threads = (bound);                                                          \
    ntp_emu_sig<decltype(&fn)>::fill(k_);                                               \
    k_->invoke = [](void **a) { ntp_emu_sig<decltype(&fn)>::invoke(&fn, a); };          \
  } while (0)

#endif
