# Sourced by the two-rank CLI test scripts (Usage: SCRIPT MIXTRAIN MPIEXEC): sets `bin`, `two` (mpirun of two ranks of
# one thread each, allowed as root) and `tmp` (removed on exit), then `write_blobs_csv FILE ROWS` writes three classes
# in 6 features, separable with some overlap, the same rows for the same count.
bin="$1"
mpiexec="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
two=("$mpiexec" -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "$bin")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

write_blobs_csv() {
  python3 - "$1" "$2" <<'PY'
import random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    f.write("a,b,c,d,e,f,label\n")
    for i in range(int(sys.argv[2])):
        c = i % 3
        row = [random.gauss(1.5 if j % 3 == c else 0.0, 1.0) for j in range(6)]
        f.write(",".join(f"{v:.4f}" for v in row) + f",{c}\n")
PY
}
