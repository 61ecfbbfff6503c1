#!/usr/bin/python3
"""torchrun for Debian's torch 1.13 on Python 3.11: `Std.from_str` iterates an IntFlag, which no
longer yields the 0 member (Std.NONE) on 3.11, returns None and crashes torchrun. Replace it."""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def from_str(cls, vm):
    if re.fullmatch(r"\d", vm):
        return api.Std(int(vm))
    return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}


api.Std.from_str = classmethod(from_str)
from torch.distributed.run import main  # noqa: E402

sys.exit(main())
