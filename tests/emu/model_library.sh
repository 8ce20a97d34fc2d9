#!/bin/sh
# model_library.sh NTPC TEST_EMU_MODEL — model libraries on the emulated GPU through the C ABI:
# gpt2 with the mixed plan (8 ranks: loopback, NCCL, device tensors), and a Llama block on 3
# ranks run as 3 processes, one rank each (the launcher path: RANK, LOCAL_RANK, NTP_NCCL_ID_FILE).
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
