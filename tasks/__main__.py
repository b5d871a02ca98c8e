"""python -m tasks: regenerate conf/task/<name>.yaml from every registered task's typed config."""
import sys

from tasks.base import REGISTRY
from tasks.config import CONF_DIR, generated


def main() -> int:
    for name in REGISTRY.names():
        path, text = generated(REGISTRY.get(name))
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(CONF_DIR.parents[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
