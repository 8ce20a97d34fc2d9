#!/bin/sh
# model_library.sh NTPC TEST_EMU_MODEL — model libraries on the emulated GPU through the C ABI:
# gpt2 with the mixed plan (8 ranks: loopback, NCCL, device tensors), and a Llama block on 3
# ranks run as 3 processes, one rank each (the launcher path: RANK, LOCAL_RANK, NTP_NCCL_ID_FILE);
# a training library (byte_gpt at 7 ranks) trained through ntp_model_train_step on the cpu and on
# the emulated GPU (loopback and NCCL): the same losses within fp32 rounding.
set -u
ntpc=$1 test=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
"$ntpc" examples/gpt2.ntp -D B=8 -D S=16 -D D=64 -D H=8 -D V=250 -D L=2 --plan examples/plans/gpt2_mixed8.ntp \
  -o "$tmp/gpt2.so" || exit 1
"$test" "$tmp/gpt2.so" || exit 1
"$ntpc" examples/llama_block.ntp -D B=6 -D S=16 -D D=64 -D H=8 --plan tests/plans/llama_block_w3_uneven.ntp \
  -o "$tmp/lb3.so" || exit 1
"$test" "$tmp/lb3.so" --procs 3 || exit 1
"$test" "$tmp/lb3.so" || exit 1
"$ntpc" examples/byte_gpt.ntp -D B=2 -D S=16 -D D=64 --train --plan examples/plans/byte_gpt_7.ntp -o "$tmp/bg.so" || exit 1
python3 tools/make_tokens.py "$tmp/docs.bin" --text README.md >/dev/null || exit 1
${CC:-cc} -std=c17 -Wall -Wextra -Werror ${NTP_TEST_CFLAGS:-} tests/unit/train_abi.c -Iruntime -ldl -lm -o "$tmp/train_abi" || exit 1
for b in cpu cuda-loopback cuda; do
  "$tmp/train_abi" "$tmp/bg.so" "$tmp/docs.bin" 3 3e-3 $b >"$tmp/abi.$b" || { cat "$tmp/abi.$b"; exit 1; }
  echo "train_abi $b:"; cat "$tmp/abi.$b"
done
for b in cuda-loopback cuda; do
  awk 'NR == FNR { if ($1 == "step") a[$2] = $4; next }
       $1 == "step" { n++; d = a[$2] - $4; if (d < 0) d = -d; if (d > 1e-5 * a[$2]) bad = 1 }
       END { exit bad || n != 3 }' "$tmp/abi.cpu" "$tmp/abi.$b" || { echo "train_abi $b: the losses differ from the cpu's"; exit 1; }
done
echo "model_library.sh: a training library trains on the emulated GPU as on the cpu"
