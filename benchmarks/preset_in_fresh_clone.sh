cd "$1"  # a fresh clone
export POSENC_LAB_CACHE="$2"  # an empty folder
shift 2  # the rest: posenc-lab ablate's arguments (none: the default preset; e.g. experiment=zoo)
echo "commit $(git rev-parse --short HEAD) start $(date -u)"; uptime
start=$(date +%s)
python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 && pip install -q -e '.[dev]'
mid=$(date +%s)
echo "INSTALL_S $((mid-start))"
/usr/bin/time -v posenc-lab ablate "$@"
end=$(date +%s)
echo "ABLATE_S $((end-mid)) end $(date -u)"; uptime
