/* fuzz_safetensors.c — the safetensors reader: the input is the file. Opened, then every
 * parameter of a fixed model read from it through the CPU reference, and once more through
 * the two-rank simulation (each rank reads only its slices). */
#include "abi_fixture.h"
#include "fuzz_common.h"
#include "ntprt.h"

static abi_fixture fx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (abi_fixture_init(&fx, 2) != 0) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(data, size, ".safetensors");
  char err[512];
  ntp_safetensors *f = NULL;
  if (ntp_safetensors_open(path, &f, err, sizeof err) != 0) return 0;
  ntp_cpu_result res;
  if (ntp_cpu_run_params(&fx.prog->global, 1, 0, f, &res, err, sizeof err) == 0) ntp_cpu_result_free(&res);
  ntp_sim *sim = NULL;
  if (ntp_sim_new(fx.prog, &sim, err, sizeof err) == 0) ntp_sim_load(sim, f, err, sizeof err);
  ntp_sim_free(sim);
  ntp_safetensors_close(f);
  return 0;
}
