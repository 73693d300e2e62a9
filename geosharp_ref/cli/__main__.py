"""``python -m geosharp_ref.cli`` (e.g. under torchrun) runs the command line."""
import sys

from . import main

sys.exit(main())
