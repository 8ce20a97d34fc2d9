# Lines of every C function definition: from the first line of its signature (a line at column 0
# that opens a declaration) to its closing brace at column 0. Brace-initialised tables end in
# "};" and are not functions. Prints "LINES FILE:NAME".
FNR == 1 { start = 0; infn = 0 }
infn && /^}$/ { print FNR - start + 1, FILENAME ":" name; infn = 0; next }
infn { next }
/^[A-Za-z_][^;]*\(/ && !/^(typedef|struct [a-z_]+ \{|enum|union)/ {
  start = FNR; s = $0; sub(/\(.*/, "", s); n = split(s, w, /[ *]+/); name = w[n]
}
/^[A-Za-z_].*\{$/ || /^ .*\) \{$/ || /^\{$/ { if (start && !/=/) infn = 1 }
/^$/ || /^\/[*\/]/ || /;$/ { if (!infn) start = 0 }
