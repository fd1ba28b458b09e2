#!/usr/bin/env bash
# Optional system tools for the export checks: Debian's Chromium (HTML tables
# rendered in a real browser) and TeX Live with booktabs (LaTeX tables
# compiled).  Needs root and apt; without them it says so and the checks that
# need the tools skip.  About 150 MB and a minute on a fresh Debian machine.
set -uo pipefail
pkgs=(chromium texlive-latex-base texlive-latex-recommended)
if command -v chromium >/dev/null && command -v pdflatex >/dev/null \
   && kpsewhich booktabs.sty >/dev/null 2>&1; then
  echo "system tools: chromium and pdflatex (booktabs) already installed"; exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system tools: not installed (needs root and apt-get); browser and LaTeX checks will skip"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; }
if install || { apt-get update -qq >/dev/null && install; }; then
  echo "system tools: installed ${pkgs[*]}"
else
  echo "system tools: apt-get could not install ${pkgs[*]}; browser and LaTeX checks will skip"
fi
