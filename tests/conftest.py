import sys
from pathlib import Path

# Tests import their independent references (tests/reference.py) by module name.
sys.path.insert(0, str(Path(__file__).parent))
