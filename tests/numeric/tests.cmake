# ---- numeric: the CPU reference against an independent NumPy implementation ----------------
# (included from tests/CMakeLists.txt; paths are relative to tests/)
# Each model in numeric/ isolates one construct; numeric/check.py runs `ntpc run --dump`,
# recomputes the outputs with NumPy and compares them (see its docstring for the metric).
# numeric_selftest.* run the same model against deliberately wrong references, each of
# which must be reported as a failure (proves every test can fail).
# Needs Debian's python3-numpy; without NumPy check.py exits 77 and the tests are skipped.
set(NTP_NUMERIC_PYTHON /usr/bin/python3 CACHE FILEPATH "Python 3 with NumPy for the numeric tests")
set(NTP_NUMERIC_MODELS
  ew_add ew_sub ew_mul ew_div ew_precedence
  un_gelu un_relu un_silu un_sigmoid un_tanh un_exp un_neg
  softmax
  mm_2d mm_shared mm_batched
  linear linear_bias linear_tied
  embedding embedding_pos
  layernorm rmsnorm
  attn_mha attn_causal attn_gqa attn_mqa attn_rope attn_bias attn_head_dim attn_full
  mlp_gelu mlp_relu mlp_silu mlp_swiglu mlp_geglu
  mlp_gelu_bias mlp_relu_bias mlp_silu_bias mlp_swiglu_bias mlp_geglu_bias
  dt_bf16_ew dt_fp16_ew dt_bf16_block dt_fp16_block)
set(NTP_NUMERIC_CHECK ${CMAKE_CURRENT_SOURCE_DIR}/numeric/check.py)
foreach(m IN LISTS NTP_NUMERIC_MODELS)
  add_test(NAME numeric.${m}
           COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_NUMERIC_CHECK} $<TARGET_FILE:ntpc_cli>
                   ${CMAKE_CURRENT_SOURCE_DIR}/numeric/${m}.ntp)
  add_test(NAME numeric_selftest.${m}
           COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_NUMERIC_CHECK} $<TARGET_FILE:ntpc_cli>
                   ${CMAKE_CURRENT_SOURCE_DIR}/numeric/${m}.ntp --mutants)
  set_tests_properties(numeric.${m} numeric_selftest.${m} PROPERTIES SKIP_RETURN_CODE 77 LABELS numeric)
endforeach()
# The shipped examples at toy sizes (bf16 end to end, repeat, tied head, GQA + RoPE).
set(NTP_EX ${CMAKE_CURRENT_SOURCE_DIR}/../examples)
add_test(NAME numeric.example.gpt2
         COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_NUMERIC_CHECK} $<TARGET_FILE:ntpc_cli> ${NTP_EX}/gpt2.ntp
                 -D B=2 -D S=16 -D D=64 -D H=4 -D V=256 -D L=2 --mutants)
add_test(NAME numeric.example.llama3_8b
         COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_NUMERIC_CHECK} $<TARGET_FILE:ntpc_cli> ${NTP_EX}/llama3_8b.ntp
                 -D B=2 -D S=16 -D D=64 -D H=4 -D G=2 -D V=256 -D L=2 --mutants)
add_test(NAME numeric.example.llama_block
         COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_NUMERIC_CHECK} $<TARGET_FILE:ntpc_cli> ${NTP_EX}/llama_block.ntp
                 -D B=2 -D S=16 -D D=64 -D H=8 -D F=128 --mutants)
add_test(NAME numeric.example.elementwise
         COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_NUMERIC_CHECK} $<TARGET_FILE:ntpc_cli> ${NTP_EX}/elementwise.ntp
                 -D B=2 -D S=4 -D D=8 --mutants)
set_tests_properties(numeric.example.gpt2 numeric.example.llama3_8b numeric.example.llama_block
                     numeric.example.elementwise PROPERTIES SKIP_RETURN_CODE 77 LABELS numeric)

# whole-model gradients (ntpc train --dump) against a NumPy forward + backward written by hand;
# each mutant (a plausible wrong rule in the reference) must make the check fail
set(NTP_GRAD_CHECK ${CMAKE_CURRENT_SOURCE_DIR}/numeric/grad_check.py)
foreach(m gpt2 llama)
  add_test(NAME numeric.grad.${m} COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_GRAD_CHECK} $<TARGET_FILE:ntpc_cli> ${m})
  set_tests_properties(numeric.grad.${m} PROPERTIES SKIP_RETURN_CODE 77 LABELS numeric)
endforeach()
foreach(case "gpt2;ln_mean" "gpt2;tied" "llama;rope_sign" "llama;gqa_sum")
  list(GET case 0 m)
  list(GET case 1 mutant)
  add_test(NAME numeric_selftest.grad.${m}.${mutant}
           COMMAND ${NTP_NUMERIC_PYTHON} ${NTP_GRAD_CHECK} $<TARGET_FILE:ntpc_cli> ${m} --mutant ${mutant})
  set_tests_properties(numeric_selftest.grad.${m}.${mutant} PROPERTIES WILL_FAIL TRUE LABELS numeric)
endforeach()
