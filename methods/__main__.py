"""python -m methods: regenerate conf/method/<name>.yaml from every registered method's typed config, then
list the registered methods (name: the first line of its config's doc): the list the README points at."""
import sys

from methods.base import REGISTRY
from methods.config import CONF_DIR, generated


def main() -> int:
    for name in REGISTRY.names():
        path, text = generated(REGISTRY.get(name))
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(CONF_DIR.parents[1])}")
    for name in REGISTRY.names():
        doc = (REGISTRY.get(name).Config.__doc__ or "").strip().split("\n")[0]
        print(f"{name:20s} {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
