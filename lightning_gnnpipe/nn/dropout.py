"""Dropout with one mask per node and epoch, the same in every chunk that reads the node.

With plain dropout (``F.dropout``, ``nn.Dropout``) on a layer's input, a chunk draws a new mask for every row it
holds, its halo rows included: a node read as a halo by several chunks is dropped differently in each of them and in
its own chunk, where full-graph training drops it once per layer. :class:`NodeDropout` instead derives the mask of
entry ``(v, j)`` (node ``v``, column ``j``) from ``(seed, epoch, v, j)`` with a counter-based hash, so the owner chunk
and every chunk or partition that reads ``v`` as a halo apply the same mask, as full-graph training does. The stage
declares the global id of each row and the epoch (:func:`node_rows`); outside such a context it is plain dropout.

Sources: the per-node consistency is what full-graph dropout (Srivastava et al., JMLR 2014) gives a node's row in one
layer; the mask is counter-based, as in Random123 (Salmon et al., SC 2011), because torch's generators cannot be
indexed by node. The 32-bit mixing function is the multiply-xorshift integer hash with constant ``0x45d9f3b``.
"""

from __future__ import annotations

import inspect
import io
import re
import textwrap
import tokenize
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_ROWS: ContextVar[Optional[Tuple[Tensor, int]]] = ContextVar("lightning_gnnpipe_node_rows", default=None)
_M32 = 0xFFFFFFFF


@contextmanager
def node_rows(ids: Tensor, epoch: int) -> Iterator[None]:
    """Declare the global node id of each row of the tensors a block is called on, and the epoch.

    :class:`NodeDropout` layers called inside the context key their masks by these ids.

    Args:
        ids: Global node id of each row, in row order ``(R,)``; integer, moved to the input's device when used.
            Only the low 32 bits enter the hash (ids ``>= 2**32`` alias ids ``2**32`` lower).
        epoch: Training epoch; every epoch draws new masks.

    Raises:
        ValueError: ``ids`` is not a 1-D integer tensor.
    """
    if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"node_rows: `ids` must be a 1-D integer tensor of node ids (got dtype {ids.dtype}, "
                         f"shape {tuple(ids.shape)}).")
    token = _ROWS.set((ids, int(epoch)))
    try:
        yield
    finally:
        _ROWS.reset(token)


def _mix32(x: Union[Tensor, int]) -> Union[Tensor, int]:
    """A 32-bit integer hash (two multiply-xorshift rounds) of a Python int or an int64 tensor of 32-bit values.

    Products stay below ``2**58``: no int64 overflow.
    """
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    return (x >> 16) ^ x


def _salt(seed: Union[Tensor, int], epoch: int) -> Union[Tensor, int]:
    """``_mix32((seed * 0x9E3779B1 + epoch * 0x85EBCA77) mod 2**32)`` for a Python int or an int64 tensor seed.

    A tensor seed stays on its device (no host read): the product is taken modulo ``2**32`` in 16-bit halves, so no
    int64 product overflows, and equals the Python int formula for every int64 seed (negative ones included).
    """
    step = (int(epoch) * 0x85EBCA77) & _M32
    if not isinstance(seed, Tensor):
        return _mix32((seed * 0x9E3779B1 + step) & _M32)
    s = seed.to(torch.int64) & _M32
    low, high = s & 0xFFFF, s >> 16
    product = (low * 0x9E3779B1 + (((high * 0x9E3779B1) & 0xFFFF) << 16)) & _M32
    return _mix32((product + step) & _M32)


def node_mask(ids: Tensor, width: int, p: float, seed: Union[Tensor, int], epoch: int) -> Tensor:
    """Return which entries of rows ``ids`` dropout keeps: a function of ``(seed, epoch, id, column)`` only.

    Args:
        ids: Global node ids ``(R,)``, integer (low 32 bits used).
        width: Columns ``d``.
        p: Drop probability; an entry is kept with probability ``1 - floor(p * 2**32) / 2**32``.
        seed: Mask seed, a Python int or a 0-d integer tensor on ``ids.device`` (read on the device, no host
            sync); both give the same mask.
        epoch: Epoch.

    Returns:
        Keep mask ``(R, d)``, bool, on ``ids.device``.
    """
    salt = _salt(seed, epoch)
    row = _mix32((ids.to(torch.int64) & _M32) ^ salt)
    u = row[:, None] + torch.arange(width, device=ids.device, dtype=torch.int64) * 0x27D4EB2F
    u.bitwise_and_(_M32).bitwise_xor_(salt >> 1)
    for _ in range(2):  # _mix32 in place on the (R, d) tensor: half the time of the out-of-place version
        u.bitwise_xor_(u >> 16).mul_(0x45D9F3B).bitwise_and_(_M32)
    u.bitwise_xor_(u >> 16)
    return u >= int(p * 2**32)


class NodeDropout(nn.Module):
    """Dropout whose mask depends on the node, not on the chunk that holds its row.

    Use it instead of ``nn.Dropout`` / ``F.dropout`` on a layer's input (before the message passing) so that a
    node's halo row is dropped exactly as its own row is: under :class:`~lightning_gnnpipe.GNNPipeStrategy` and
    :class:`~lightning_gnnpipe.GraphParallelStrategy` every block call declares each row's global node id and the
    epoch (:func:`node_rows`), and the mask of entry ``(v, j)`` is a hash of ``(seed, epoch, v, j)``
    (:func:`node_mask`). Outside that context it is ``F.dropout``: single-device training, and any code that calls
    a block outside the strategy's step (activation checkpointing that recomputes a block in the backward pass
    would draw a different mask, so it is not supported with this layer). In evaluation mode it is the identity.
    The hash costs about ten int64 operations per entry: on one CPU thread 1.7x to 2.0x the time of ``F.dropout``
    on a ``(3327, 3703)`` input, about the same on ``(3327, 64)`` (``benchmarks/accuracy/node_dropout.py``).

    Args:
        p: Probability of zeroing an entry, in ``[0, 1)``.
        seed: Seed of the masks; ``None`` draws one from the global RNG at construction (call
            ``seed_everything`` before building the model). It is a buffer: saved in checkpoints, and broadcast with
            the weights where the strategies broadcast them.

    Shapes:
        ``x`` ``(R, d)`` -> ``(R, d)``, the same dtype.

    Raises:
        ValueError: ``p`` outside ``[0, 1)``; in forward (training mode, ``p > 0``), an input that is not
            ``(R, d)``, or under :func:`node_rows` one whose rows do not match the declared nodes.
    """

    seed: Tensor

    def __init__(self, p: float = 0.5, seed: Optional[int] = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"NodeDropout: `p` must be in [0, 1) (got {p}).")
        self.p = float(p)
        value = int(torch.randint(0, 2**31 - 1, ())) if seed is None else int(seed)
        self.register_buffer("seed", torch.tensor(value, dtype=torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        """Drop entries of ``x`` ``(R, d)`` with probability ``p`` and scale the kept ones by ``1 / (1 - p)``."""
        if not self.training or self.p == 0.0:
            return x
        if x.dim() != 2:  # also outside the strategies, so that a model fails on one device as it would under them
            raise ValueError(f"NodeDropout: expected node embeddings of shape (R, d) (got {tuple(x.shape)}). "
                             "Apply it to node embeddings, not to edge or head tensors.")
        rows = _ROWS.get()
        if rows is None:
            return F.dropout(x, self.p, True)
        ids, epoch = rows
        if x.size(0) != ids.numel():
            raise ValueError(f"NodeDropout: expected one row per node of the block's input, shape ({ids.numel()}, d) "
                             f"(got {tuple(x.shape)}). Apply it to node embeddings, not to edge or head tensors.")
        # the seed buffer is read on the device: no host sync per call (one per chunk and layer otherwise)
        keep = node_mask(ids.to(x.device), x.size(-1), self.p, self.seed.to(x.device), epoch)
        return x.masked_fill(~keep, 0.0) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def make_dropout(p: float, per_node: bool) -> nn.Module:
    """Return :class:`NodeDropout` ``(p)`` if ``per_node`` else ``nn.Dropout(p)``.

    Args:
        p: Probability of zeroing an entry.
        per_node: One mask per node and epoch, the same in every chunk and partition (:class:`NodeDropout`).

    Returns:
        A dropout module, ``(R, d) -> (R, d)``.

    Raises:
        ValueError: ``per_node`` and ``p`` outside ``[0, 1)`` (``nn.Dropout`` itself refuses ``p`` outside ``[0, 1]``).
    """
    return NodeDropout(p) if per_node else nn.Dropout(p)


DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout, NodeDropout)
"""Modules that drop entries at training time (with ``p > 0``)."""


_FUNCTIONAL_DROPOUT = re.compile(r"(?:\b(?:F|functional|torch)\.|(?<![\w.])(?<!def ))"
                                 r"(?:feature_alpha_|alpha_|feature_)?dropout(?:[123]d)?\s*\(")
"""A call of a functional dropout in code: ``F.dropout(``, ``torch.nn.functional.dropout(``, ``torch.dropout(``,
``F.alpha_dropout(``, ``F.dropout2d(``, ..., or of one imported by its name (``dropout(``; not a method such as
``self.dropout(``, a module read from its attributes, nor a ``def dropout(``)."""
_LIBRARIES = ("torch", "torch_geometric", "lightning_gnnpipe")
"""Packages whose modules' dropout is read from their attributes (``p``, ``dropout``), not from their source."""


_SOURCE_READ: "weakref.WeakKeyDictionary[type, Optional[str]]" = weakref.WeakKeyDictionary()
_NOT_CODE = tuple(t for t in (tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", None))
                  if t is not None)  # Python 3.12+ splits f-strings into tokens of their own


def _calls_functional_dropout(cls: type) -> Optional[str]:
    """``cls``'s name (and its base's, where a base's code calls it) if a class of its MRO outside :data:`_LIBRARIES`
    calls a functional dropout in its code (comments and strings left out); ``None`` if none, or if no source can be
    read. Read once per class (kept while the class lives)."""
    try:
        return _SOURCE_READ[cls]
    except KeyError:
        pass
    except TypeError:  # a class that cannot be a weak reference's key (unhashable, or no weak references)
        return _read_functional_dropout(cls)
    found = _read_functional_dropout(cls)
    try:
        _SOURCE_READ[cls] = found
    except TypeError:
        pass
    return found


def _read_functional_dropout(cls: type) -> Optional[str]:
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in _LIBRARIES or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
            tokens = tokenize.generate_tokens(io.StringIO(source).readline)
            code = " ".join(t.string for t in tokens if t.type not in _NOT_CODE)
        except (OSError, TypeError, tokenize.TokenError, IndentationError, SyntaxError):
            continue
        if _FUNCTIONAL_DROPOUT.search(code.replace(" . ", ".").replace(" (", "(")):
            return cls.__name__ if klass is cls else f"{cls.__name__} (its base {klass.__name__})"
    return None


def first_dropout(blocks: Sequence[nn.Module]) -> Optional[str]:
    """Where the first dropout of ``blocks`` is (``"block 1 (drop): Dropout(p=0.5)"``): a module of :data:`DROPOUTS`
    with ``p > 0``, a module with a number ``dropout`` above 0 (PyG convs such as ``GATConv``), or a module of a class
    of the user's own (not torch's, PyG's or this package's) with no such number whose source calls a functional
    dropout (``F.dropout(``, ``torch.dropout(``, ``F.alpha_dropout(``, a ``dropout(`` imported by its name, ...
    outside comments and strings: ``"block 1: ResBlock calls F.dropout"``); ``None`` if none. A module's number
    decides where it has one (``dropout=0.0`` is no dropout, whatever its code calls); else a call is taken for a
    dropout whatever its ``p`` and ``training`` arguments (they cannot be read without running the block). Not seen:
    a call under another name (``import torch.nn.functional as nnf``, an alias), in a function the block calls, in a
    class whose source cannot be read (made by ``type()`` or ``exec``, typed in at the prompt) or in a scripted or
    traced module (its class is torch's).

    Args:
        blocks: The model's layer blocks (:class:`~lightning_gnnpipe.nn.stack.LayerStack`'s).

    Raises nothing."""
    for i, block in enumerate(blocks):
        for name, m in block.named_modules():
            where = f"block {i}" + (f" ({name})" if name else "")
            p = getattr(m, "p", None) if isinstance(m, DROPOUTS) else getattr(m, "dropout", None)
            if isinstance(p, (int, float)) and not isinstance(p, bool):
                if p > 0:
                    return f"{where}: {type(m).__name__}(p={p})"
                continue  # its own number says it drops nothing
            caller = _calls_functional_dropout(type(m))
            if caller is not None:
                return f"{where}: {caller} calls F.dropout"
    return None
