"""The words natural language is read with, apart from the catalog's terms (queries.yaml):
plain English and the fabric's own nouns (understood, naming no query), what nothing in the
catalog measures, action verbs, and chat shorthand. A word in none of these and in no
query's terms is one the interpretation does not understand: the matcher abstains on it.
"""
from __future__ import annotations

import re

# Chat and runbook shorthand -> the words it stands for (whole words only).
SHORTHAND = {
    "rn": "right now", "atm": "at the moment", "asap": "now", "errs": "errors", "err": "error",
    "crit": "critical", "crits": "critical", "warn": "warning", "warns": "warnings", "wk": "week", "wks": "weeks",
    "yday": "yesterday", "pls": "please", "plz": "please", "thx": "thanks", "ty": "thanks", "u": "you",
    "r": "are", "ur": "your", "w/": "with", "w/o": "without", "runq": "runqueue", "lat": "latency",
    "b/c": "because", "bc": "because", "nw": "network", "approx": "about", "lst": "last", "2day": "today",
    "2nite": "tonight", "b4": "before", "yest": "yesterday", "prev": "previous", "wich": "which", "teh": "the",
    "l8ly": "lately", "jb": "job", "fleetwide": "fleet wide", "clusterwide": "cluster wide",
}
_SHORTHAND = re.compile(r"(?<![\w/-])(" + "|".join(re.escape(k) for k in sorted(SHORTHAND, key=len, reverse=True))
                        + r")(?![\w/-])", re.I)


# A runbook's step number ("Step 1:", "2)") is no part of the question.
_ENUMERATOR = re.compile(r"^\s*(?:step\s*)?[0-9]{1,2}\s*[:.)]\s+", re.I)


# An alert's name is made of the words of what it watches: "FabricNcclHang" -> "nccl hang".
_ALERT_NAME = re.compile(r"\bFabric((?:[A-Z][a-z0-9]*|[A-Z]+(?![a-z]))+)\b")


def _alert_words(match: re.Match[str]) -> str:
    return " ".join(re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z0-9]*", match.group(1))).lower()


def expand_shorthand(message: str) -> str:
    message = _ALERT_NAME.sub(_alert_words, _ENUMERATOR.sub("", message, count=1))
    return _SHORTHAND.sub(lambda m: SHORTHAND[m.group(1).lower()], message)


# What no registered query measures: never typo-corrected, never filler.
OUT_OF_SCOPE = frozenset("""
temperature temperatures temp temps thermal overheating heat watts wattage draw memory vram hbm dram pod pods
kubernetes k8s kubectl crashloop crashlooping crashloopbackoff disk disks filesystem inode inodes scheduled
scheduling schedule queued bandwidth busbw algbw throughput utilization utilisation utilized occupancy joke jokes
fan fans pue humidity airflow clock clocks voltage ecc speed speeds mtu uptime cuda tokens
""".split())

# The layer only reads: a question asking for one of these is refused as an action.
ACTIONS = frozenset("""
restart restarts reboot drain cordon uncordon kill delete remove create close file fix repair reset shutdown
disable enable replace reseat submit cancel deploy upgrade install write compose reimage power-cycle silence
silenced mute unmute ack acknowledge suppress snooze purge wipe flush requeue evict terminate rollback
""".split())

# Words of the fabric's world that name no query by themselves: never "unknown".
DOMAIN = frozenset("""
network networks nccl comm comms communicator communicators threshold request requests collective collectives
job jobs gpu gpus rank ranks port ports link links device devices switch switches error errors rate rates count
counts event events cluster clusters fleet value values metric metrics calls threads thread node nodes
training train service services host hosts box boxes server servers card cards adapter adapters
pretraining finetuning inference step steps time level regressed regression spans span latency
detection detect detected delay delays delayed anomaly anomalies open estimate estimated id ids pci bus segments
segment core cores packet packets fabric fabrics severity severities detector detectors arrival arrivals
""".split())
# Generic English that carries no topic.
FILLER = frozenset("""
see seen saw moment everyone everybody one went going gone making make made wide high higher highest low lower
lowest noisiest overnight unusual weird odd strange bad good looks look looking seem seems seeing happening
anything something nothing thing things currently right tell please much lot lots really just still ever
whole across per since morning evening night yet already again okay ok hey folks guys team quick quickly
anywhere somewhere line lines up bunch whats wanna need want know let lets kind sort
getting got meeting meet blowing burning holding keep keeps kept giving give shows showing mean means
but into while via among they it's i'm he she him her his hers ours yours theirs itself myself whose whom
am isn't aren't wasn't weren't not no yes yeah yep nope should shall may might must cannot cant dont
doesnt didnt isnt arent wasnt werent wont hasnt havent hadnt couldnt wouldnt shouldnt than too very
most least few fewer less other others another such same different both either neither each own
here there where wherever whenever however although though because since until unless whether
about above below under between through throughout toward towards upon onto off out around near
find found finding check checking checked report reported reporting show shown list listing listed
grouped group grouping sorted sort ordered order ranked broken breakdown detail details
currently current recent recently lately latest last first next previous earlier later ago soon
hi hello yo sup thanks thank cheers lol btw fyi imo tbh idk ngl asap atm rn pls plz thx
wait waiting wondering wonder curious think thought guess maybe perhaps probably possibly actually
basically literally seriously totally quite rather pretty fairly somewhat anyway anyways
involving involved including include includes adding added add getting hit hits hitting
throwing throws thrown talking talk talks doing done dealing deal hammering
inside outside beyond against along beside besides despite except like unlike plus versus vs within without
pressure heavy heavily busy massive huge big small tiny
confirm confirmed someone anyone somebody anybody point points consistently constantly always never often
sometimes usually regularly repeatedly fall fell fallen hurting hurt suffering struggling crawling tanking
identify verify verified determine obtain review inspect investigate examine lookup fetch retrieve display print dump compute calculate measure monitor watch track logged recorded seen step steps
ones stuff bits dude mate yall boss peeps
ugh argh hmm um uh oops damn meh welp whoa wow omg sigh alright
using use uses used long says said say runbook triage handoff postmortem bound pull pulls bring grab
whos wats wat whats hows wheres whens whys thats theres heres im ive youre theyre were weve lemme gimme gotta
""".split())
# Words a question is made of that are not catalog terms: never "corrected" into one
# ("last" is not a typo of "blast").
PLAIN = frozenset("""
a about after all also am an and any anything are as at be been before being by can could
day days did do does doing down during each every for from get give had has have host hosts hour hours how
i if in is it its job jobs last list machine machines many me minute minutes more my nodes node now of on only or
our over past please plz previous right seconds server servers show since so some than that the their them then
there these this those to today top up us was we week weeks were what when where which who why
will with within would yesterday you your
""".split())
# Plain words a typo may stand for ("whcih" for "which"): never read as "unknown".
EXPLAINED: dict[str, list[str]] = {}
for _word in sorted(PLAIN | FILLER | DOMAIN):
    if len(_word) >= 4:
        EXPLAINED.setdefault(_word[0], []).append(_word)
