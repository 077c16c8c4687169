"""Scheme names for tests of one scheme's math, taken from the scheme classes (no name literals):
a test about Shaw's clipping imports Shaw. Tests about every scheme ask the registry instead
(``SCHEME_NAMES``, ``schemes_of_kind``)."""

from posenc_lab.positional.alibi import ALiBi
from posenc_lab.positional.cope import CoPE
from posenc_lab.positional.fire import FIRE
from posenc_lab.positional.fox import FoX
from posenc_lab.positional.global_sinusoid import GlobalSinusoid
from posenc_lab.positional.hybrid import Hybrid
from posenc_lab.positional.kerple_log import KerpleLog
from posenc_lab.positional.kerple_power import KerplePower
from posenc_lab.positional.learned import Learned
from posenc_lab.positional.nope import NoPE
from posenc_lab.positional.path import PaTH
from posenc_lab.positional.pope import PoPE
from posenc_lab.positional.rope import RoPE
from posenc_lab.positional.sandwich import Sandwich
from posenc_lab.positional.shaw import Shaw
from posenc_lab.positional.sinusoid import Sinusoid
from posenc_lab.positional.stickbreaking import StickBreaking
from posenc_lab.positional.t5 import T5Bias
from posenc_lab.positional.wall import Wall
from posenc_lab.positional.xl import XLRelative
from posenc_lab.positional.xpos import XPos

ALIBI, GLOBAL_SINUSOID, LEARNED, NOPE, ROPE = ALiBi.name, GlobalSinusoid.name, Learned.name, NoPE.name, RoPE.name
SHAW, SINUSOID, T5, XL = Shaw.name, Sinusoid.name, T5Bias.name, XLRelative.name
COPE, FIRE, KERPLE_LOG, KERPLE_POWER, SANDWICH, XPOS = (
    CoPE.name,
    FIRE.name,
    KerpleLog.name,
    KerplePower.name,
    Sandwich.name,
    XPos.name,
)
FOX, STICKBREAKING, PATH = FoX.name, StickBreaking.name, PaTH.name
HYBRID = Hybrid.name
POPE, WALL = PoPE.name, Wall.name
#: a hybrid of two layers, for the models of two layers that tests build of every scheme (its yaml's pattern of four
#: would be refused there)
HYBRID_OF_TWO = {"layers": [ROPE, NOPE]}
