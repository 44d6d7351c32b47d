# Datastar 1.0.1 from PyPI: the starhtml 0.7.0 wheel carries it, self-contained, as datastar-core.js.
python -m pip download --no-deps --only-binary=:all: --python-version 3.12 starhtml==0.7.0 -d .starhtml
python -m zipfile -e .starhtml/starhtml-0.7.0-py3-none-any.whl .starhtml
mkdir -p static
cp .starhtml/starhtml/static/js/datastar-core.js static/datastar.js
rm -r .starhtml
