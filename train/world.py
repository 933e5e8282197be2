"""A fictional world for RAG questions: people, companies and cities with attributes and
relations, documents that state them in varied sentences, and questions of four kinds.

Everything is drawn from a random.Random, so a seed fixes the data. Two splits never meet:
  - entities: a name belongs to the training split or the held-out split by a hash of its text,
    so evaluation asks about people, companies and cities the model never saw;
  - phrasings: some document sentences, questions and system prompts exist only in the held-out
    split, so the model is shown to read sentences it was not trained on.

A prompt is the list of segments the gateway makes of a chat request with `documents`
(DESIGN §3): the system segment, one chunk per document, and the question segment, rendered
with the checkpoint's ChatML template. The answer follows the question segment.

Question kinds and their answers (exact match compares the whole answer text):
  single   "Where does Mara Velkin live?"            -> "Tarsk"
  twohop   "Where is Mara Velkin's employer based?"   -> "Ostrade Mills, Tarsk"
  compare  "Who is older, Mara Velkin or Ivo Dant?"   -> "34 vs 51: Ivo Dant"
  unknown  a question about someone in no document    -> "unknown"
Two-hop and comparison answers name the intermediate facts first (a short chain of thought),
which a model this small needs to answer them at all.
"""

import hashlib
import random

KINDS = ("single", "twohop", "compare", "unknown")
SPLITS = ("train", "heldout")

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
          "kr", "tr", "st", "sh", "th", "h", "j", "w"]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "ia"]
CODAS = ["", "", "", "n", "r", "l", "s", "m", "k", "th", "nd", "rt"]
CITY_SUFFIX = ["", "", "", "ton", "ford", "mouth", "vale", "burg", "wick", "holm"]
COMPANY_KIND = ["Mills", "Labs", "Works", "Group", "Systems", "Foods", "Motors", "Press",
                "Textiles", "Shipping", "Energy", "Optics"]
JOBS = ["pilot", "nurse", "baker", "teacher", "lawyer", "chemist", "welder", "architect",
        "farmer", "painter", "surgeon", "librarian", "plumber", "journalist", "engineer",
        "accountant", "gardener", "translator", "electrician", "pharmacist", "carpenter",
        "geologist", "dentist", "tailor"]
PRODUCTS = ["lamps", "bicycles", "glass bottles", "paper", "ceramic tiles", "radios",
            "wool coats", "canned fish", "boots", "printing ink", "garden tools", "clocks",
            "solar panels", "rope", "cheese", "violins", "sails", "soap", "maps", "chairs",
            "pumps", "tea", "lenses", "batteries"]

# Document sentences: (fact, template, split). {n} is the subject as written in this
# sentence (a full name, or a pronoun after the first sentence about a person); {o} is the
# entity where a pronoun would not fit ("the age of {o}"), always its full name.
PERSON_SENT = [
    ("city", "{n} lives in {v}.", "train"),
    ("city", "{n} has a house in {v}.", "train"),
    ("city", "These days {n} lives in the city of {v}.", "train"),
    ("city", "{n} moved to {v} some years ago and still lives there.", "train"),
    ("city", "{n} resides in {v}.", "train"),
    ("city", "{n} grew up elsewhere but now lives in {v}.", "train"),
    ("city", "The home of {o} is in {v}.", "train"),
    ("city", "{n} owns an apartment in {v}.", "train"),
    ("city", "{n} is a resident of {v}.", "train"),
    ("city", "{n} has an apartment in {v}.", "heldout"),
    ("city", "The house of {o} is in {v}.", "heldout"),
    ("city", "{n} still resides in the city of {v}.", "heldout"),
    ("employer", "{n} works for {v}.", "train"),
    ("employer", "{n} is employed by {v}.", "train"),
    ("employer", "{n} has a job at {v}.", "train"),
    ("employer", "For several years {n} has worked at {v}.", "train"),
    ("employer", "{n} is on the payroll of {v}.", "train"),
    ("employer", "{n} got a position at {v}.", "train"),
    ("employer", "The employer of {o} is {v}.", "train"),
    ("employer", "{n} is a member of staff at {v}.", "train"),
    ("employer", "{n} has a position at {v}.", "heldout"),
    ("employer", "{n} is employed at {v}.", "heldout"),
    ("employer", "For some years {n} has worked on the staff of {v}.", "heldout"),
    ("job", "{n} works as a {v}.", "train"),
    ("job", "{n} is a {v} by trade.", "train"),
    ("job", "By profession {n} is a {v}.", "train"),
    ("job", "{n} makes a living as a {v}.", "train"),
    ("job", "{n} is a {v}.", "train"),
    ("job", "{n} spent years working as a {v}.", "train"),
    ("job", "The profession of {o} is that of a {v}.", "train"),
    ("job", "{n} is a {v} by profession.", "heldout"),
    ("job", "By trade {n} is a {v}.", "heldout"),
    ("job", "{n} has a job as a {v}.", "heldout"),
    ("age", "{n} is {v} years old.", "train"),
    ("age", "{n} turned {v} this year.", "train"),
    ("age", "At {v}, {n} is no longer young.", "train"),
    ("age", "{n} is aged {v}.", "train"),
    ("age", "{n} is now {v}.", "train"),
    ("age", "The age of {o} is {v}.", "train"),
    ("age", "{n} is now aged {v}.", "heldout"),
    ("age", "This year {n} turned {v}.", "heldout"),
    ("age", "{n} is {v} years of age.", "heldout"),
]
COMPANY_SENT = [
    ("city", "{n} is based in {v}.", "train"),
    ("city", "{n} has its head office in {v}.", "train"),
    ("city", "The headquarters of {n} are in {v}.", "train"),
    ("city", "{n} is located in {v}.", "train"),
    ("city", "The offices of {o} stand in {v}.", "train"),
    ("city", "{n} operates out of {v}.", "train"),
    ("city", "The head office of {o} is in {v}.", "heldout"),
    ("city", "{n} is based out of {v}.", "heldout"),
    ("product", "{n} makes {v}.", "train"),
    ("product", "{n} produces {v}.", "train"),
    ("product", "The main product of {n} is {v}.", "train"),
    ("product", "{n} manufactures {v}.", "train"),
    ("product", "{n} turns out {v} by the thousand.", "train"),
    ("product", "What {n} makes is {v}.", "train"),
    ("product", "{n} is known for its {v}.", "heldout"),
    ("product", "What {n} produces is {v}.", "heldout"),
    ("founded", "{n} was founded in {v}.", "train"),
    ("founded", "{n} opened its doors in {v}.", "train"),
    ("founded", "{n} was established in {v}.", "train"),
    ("founded", "{n} was set up in {v}.", "train"),
    ("founded", "The founding year of {o} is {v}.", "train"),
    ("founded", "{n} was first established in {v}.", "heldout"),
    ("founded", "The year {o} was founded is {v}.", "heldout"),
]
# Openings any fact sentence may take: the fact then sits at another place in the sentence,
# after words that say nothing about it. The held-out one is made of words seen in training.
FRAMES = [
    ("According to the records, {s}", "train"),
    ("As far as anyone knows, {s}", "train"),
    ("It is said that {s}", "train"),
    ("At present, {s}", "train"),
    ("As the town hall records show, {s}", "heldout"),
]
FILLER = [
    ("The weather there is often grey in winter.", "train"),
    ("Local newspapers have written about it more than once.", "train"),
    ("The town hall keeps records of such things.", "train"),
    ("Not much else is known.", "train"),
    ("This was noted in a report last year.", "train"),
    ("Few people outside the region had heard of it.", "train"),
    ("The details were confirmed by a neighbour.", "train"),
    ("Trains to the coast leave every hour.", "train"),
    ("The river nearby floods almost every spring.", "train"),
    ("A short article about it appeared in a trade magazine.", "train"),
    ("Most of this was checked twice.", "heldout"),
    ("The old market square is a short walk away.", "heldout"),
    ("Nobody recalls exactly when this began.", "heldout"),
]
QUESTIONS = {
    ("single", "person", "city"): [("Where does {a} live?", "train"),
                                   ("In which city does {a} live?", "train"),
                                   ("Which city is {a}'s home?", "train"),
                                   ("Where is {a}'s home?", "train"),
                                   ("What city does {a} live in?", "train"),
                                   ("Where does {a} reside?", "train"),
                                   ("In what city does {a} live?", "heldout"),
                                   ("Which city does {a} live in?", "heldout")],
    ("single", "person", "employer"): [("Who does {a} work for?", "train"),
                                       ("Which company employs {a}?", "train"),
                                       ("Who is {a}'s employer?", "train"),
                                       ("What company does {a} work for?", "train"),
                                       ("Which firm is {a} employed by?", "train"),
                                       ("Which company is {a} employed by?", "heldout"),
                                       ("Who employs {a}?", "heldout")],
    ("single", "person", "job"): [("What is {a}'s job?", "train"),
                                  ("What does {a} do for a living?", "train"),
                                  ("What is the profession of {a}?", "train"),
                                  ("What is {a}'s occupation?", "train"),
                                  ("What does {a} work as?", "train"),
                                  ("What is {a}'s profession?", "heldout"),
                                  ("What work does {a} do?", "heldout")],
    ("single", "person", "age"): [("How old is {a}?", "train"),
                                  ("What age is {a}?", "train"),
                                  ("What is the age of {a}?", "train"),
                                  ("How old is {a} now?", "train"),
                                  ("How many years old is {a}?", "heldout")],
    ("single", "company", "city"): [("Where is {a} based?", "train"),
                                    ("In which city is {a} located?", "train"),
                                    ("Where are the offices of {a}?", "train"),
                                    ("Which city is {a} in?", "train"),
                                    ("Where does {a} have its head office?", "heldout")],
    ("single", "company", "product"): [("What does {a} make?", "train"),
                                       ("What does {a} produce?", "train"),
                                       ("What does {a} manufacture?", "train"),
                                       ("What product is {a} known for?", "train"),
                                       ("What is the main product of {a}?", "heldout")],
    ("single", "company", "founded"): [("When was {a} founded?", "train"),
                                       ("In what year was {a} founded?", "train"),
                                       ("When was {a} established?", "train"),
                                       ("What year did {a} start?", "train"),
                                       ("In which year was {a} established?", "heldout")],
    ("twohop", "person", "city"): [("Where is {a}'s employer based?", "train"),
                                   ("In which city is the company {a} works for?", "train"),
                                   ("Where is the company that employs {a} located?", "heldout")],
    ("twohop", "person", "product"): [("What does {a}'s employer make?", "train"),
                                      ("What does the company {a} works for produce?", "train"),
                                      ("What does the company that employs {a} make?", "heldout")],
    ("compare", "person", "age"): [("Who is older, {a} or {b}?", "train"),
                                   ("Which of {a} and {b} is older?", "train"),
                                   ("Of {a} and {b}, who is older?", "heldout")],
    ("compare", "company", "founded"): [("Which company is older, {a} or {b}?", "train"),
                                        ("Which was founded first, {a} or {b}?", "train"),
                                        ("Of {a} and {b}, which company is older?", "heldout")],
}
SYSTEMS = [
    ("Answer the question from the documents.", "train"),
    ("You are a helpful assistant. Use only the documents below.", "train"),
    ("Read the documents and answer briefly.", "train"),
    ("You answer questions about people and companies.", "train"),
    ("Be brief. If the documents do not say, answer unknown.", "train"),
    ("You are a careful research assistant. Answer from the documents only.", "heldout"),
    ("Reply with a short answer based on the documents.", "heldout"),
]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SEPARATOR = "# #"


def split_of(name):
    """The split an entity name belongs to: about one name in eight is held out."""
    return "heldout" if hashlib.sha256(name.encode()).digest()[0] % 8 == 0 else "train"


def pick(rng, rows, split):
    """A row usable in `split`: the training split uses training rows only; the held-out split
    uses held-out rows half of the time, when there are any."""
    tr = [r for r in rows if r[-1] == "train"]
    ho = [r for r in rows if r[-1] == "heldout"]
    if split == "heldout" and ho and rng.random() < 0.5:
        return rng.choice(ho)
    return rng.choice(tr)


class World:
    def __init__(self, rng, split):
        self.rng, self.split = rng, split
        self.used = set()

    def _syl(self, n):
        r = self.rng
        return "".join(r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS) for _ in range(n))

    def _name(self, make):
        for _ in range(1000):
            s = make()
            if s not in self.used and split_of(s) == self.split and len(s) < 28:
                self.used.add(s)
                return s
        raise RuntimeError("no fresh name")

    def person(self):
        name = self._name(lambda: self._syl(self.rng.choice((1, 2))).capitalize() + " " +
                          self._syl(self.rng.choice((2, 2, 3))).capitalize())
        return {"type": "person", "name": name, "he": self.rng.choice(("He", "She"))}

    def company(self):
        return {"type": "company",
                "name": self._name(lambda: self._syl(2).capitalize() + " " +
                                   self.rng.choice(COMPANY_KIND))}

    def entity(self, etype):
        """A fresh person or company."""
        return self.person() if etype == "person" else self.company()

    def namesake(self, e):
        """A fresh entity of e's type whose name shares a part with e's (a person's first name
        or surname, a company's first word): told apart from e only by the whole name."""
        first, last = e["name"].split(" ", 1)
        if e["type"] == "company":
            make = lambda: first + " " + self.rng.choice(COMPANY_KIND)  # noqa: E731
        elif self.rng.random() < 0.5:
            make = lambda: first + " " + self._syl(self.rng.choice((2, 2, 3))).capitalize()  # noqa: E731
        else:
            make = lambda: self._syl(self.rng.choice((1, 2))).capitalize() + " " + last  # noqa: E731
        try:
            name = self._name(make)
        except RuntimeError:
            return self.entity(e["type"])
        return dict(e, name=name, facts=None) if e["type"] == "company" else \
            {"type": "person", "name": name, "he": self.rng.choice(("He", "She"))}

    def city(self):
        return self._name(lambda: (self._syl(self.rng.choice((1, 2))) +
                                   self.rng.choice(CITY_SUFFIX)).capitalize())


def person_facts(w, p, company=None):
    r = w.rng
    f = {"city": w.city(), "job": r.choice(JOBS), "age": str(r.randint(19, 88))}
    f["employer"] = company["name"] if company else w.company()["name"]
    p["facts"] = f
    return p


def company_facts(w, c):
    r = w.rng
    c["facts"] = {"city": w.city(), "product": r.choice(PRODUCTS),
                  "founded": str(r.randint(1850, 2015))}
    return c


def with_facts(w, e):
    """Entity e with the facts of its type drawn."""
    return person_facts(w, e) if e["type"] == "person" else company_facts(w, e)


def fact_sentence(tmpl, e, fact, subj):
    """A document sentence template filled in for entity e's fact, with subj as its subject."""
    v = e["facts"][fact]
    if "a {v}" in tmpl and v[0] in "aeiou":
        tmpl = tmpl.replace("a {v}", "an {v}")
    return tmpl.format(n=subj, o=e["name"], v=v)


def document(w, e, must):
    """A document about entity e stating the facts in `must` and a few others, in random order,
    with filler sentences between."""
    r, split = w.rng, w.split
    rows = PERSON_SENT if e["type"] == "person" else COMPANY_SENT
    facts = list(e["facts"])
    extra = [f for f in facts if f not in must]
    r.shuffle(extra)
    told = list(must) + extra[:r.randint(0 if must else 1, len(extra))]
    r.shuffle(told)
    out = []
    for i, fact in enumerate(told):
        subj = e["name"]
        if i > 0 and r.random() < 0.4:
            subj = e["he"] if e["type"] == "person" else "It"
        tmpl = pick(r, [row[1:] for row in rows if row[0] == fact], split)[0]
        if "{o}" in tmpl:
            subj = e["name"]
        if subj != e["name"] and not tmpl.startswith("{n}"):
            subj = subj.lower()
        s = fact_sentence(tmpl, e, fact, subj)
        if r.random() < 0.25:
            if not s.startswith(e["name"]):
                s = s[0].lower() + s[1:]
            s = pick(r, FRAMES, split)[0].format(s=s)
        s = s[0].upper() + s[1:]
        out.append(s)
        if r.random() < 0.2:
            out.append(pick(r, FILLER, split)[0])
    if r.random() < 0.2:
        out.insert(0, pick(r, FILLER, split)[0])
    return " ".join(out), told


def question(w, kind, max_docs=6, extra=0, hard=False):
    """One RAG example: (system, documents, question, answer, kind). The documents are shuffled
    and include distractors: 4-6 of them, or up to max_docs when that is smaller (a training
    curriculum starts with short prompts). With hard set (training only), the distractors of a
    single-hop or unknown question are entities of the asked one's type that state the asked
    fact, half of them with a name sharing a part with the asked name: the only way to the
    answer is to find the document about the whole name asked for."""
    r, split = w.rng, w.split
    docs = []  # (entity, facts that must be stated)
    n_docs = r.randint(min(4, max_docs), max_docs)
    like = None  # (entity, fact) the hard distractors imitate
    if kind == "single":
        etype = r.choice(("person", "person", "company"))
        fact = r.choice([k[2] for k in QUESTIONS if k[0] == "single" and k[1] == etype])
        e = person_facts(w, w.person()) if etype == "person" else company_facts(w, w.company())
        docs.append((e, [fact]))
        q = pick(r, QUESTIONS[("single", etype, fact)], split)[0].format(a=e["name"])
        a = e["facts"][fact]
        like = (e, fact)
    elif kind == "twohop":
        fact = r.choice(("city", "product"))
        c = company_facts(w, w.company())
        p = person_facts(w, w.person(), c)
        docs += [(p, ["employer"]), (c, [fact])]
        if n_docs >= 4:  # a distractor: someone else at another company in another city
            c2 = company_facts(w, w.company())
            docs += [(person_facts(w, w.person(), c2), ["employer"]), (c2, [fact])]
        q = pick(r, QUESTIONS[("twohop", "person", fact)], split)[0].format(a=p["name"])
        a = "%s, %s" % (c["name"], c["facts"][fact])
    elif kind == "compare":
        etype = r.choice(("person", "company"))
        fact = "age" if etype == "person" else "founded"
        make = lambda: with_facts(w, w.entity(etype))  # noqa: E731
        x, y = make(), make()
        while x["facts"][fact] == y["facts"][fact]:
            y = make()
        docs += [(x, [fact]), (y, [fact])]
        q = pick(r, QUESTIONS[("compare", etype, fact)], split)[0].format(a=x["name"], b=y["name"])
        vx, vy = int(x["facts"][fact]), int(y["facts"][fact])
        older = x if (vx > vy if fact == "age" else vx < vy) else y
        a = "%d vs %d: %s" % (vx, vy, older["name"])
    else:
        etype = r.choice(("person", "person", "company"))
        fact = r.choice([k[2] for k in QUESTIONS if k[0] == "single" and k[1] == etype])
        absent = w.entity(etype)
        q = pick(r, QUESTIONS[("single", etype, fact)], split)[0].format(a=absent["name"])
        a = "unknown"
        like = (absent, fact)
    while len(docs) < n_docs:
        if hard and like:
            e0, fact = like
            e = w.namesake(e0) if r.random() < 0.5 else w.entity(e0["type"])
            docs.append((with_facts(w, e), [fact]))
            continue
        e = person_facts(w, w.person()) if r.random() < 0.6 else company_facts(w, w.company())
        docs.append((e, []))
    texts, facts = [], []
    for e, must in docs:
        t, told = document(w, e, must)
        texts.append(t)
        facts += [(e, f) for f in told]
    r.shuffle(texts)
    system = pick(r, SYSTEMS, split)[0]
    # more questions on the same documents: single-hop facts they state, now and then someone
    # they do not mention (training asks several per prompt: far more answers per token)
    more = []
    for _ in range(extra):
        if r.random() < 0.15:
            absent = w.person() if r.random() < 0.7 else w.company()
            f = r.choice([k[2] for k in QUESTIONS if k[0] == "single" and k[1] == absent["type"]])
            more.append((pick(r, QUESTIONS[("single", absent["type"], f)], split)[0].format(
                a=absent["name"]), "unknown"))
        else:
            e, f = r.choice(facts)
            more.append((pick(r, QUESTIONS[("single", e["type"], f)], split)[0].format(
                a=e["name"]), e["facts"][f]))
    return {"system": system, "documents": texts, "question": q, "answer": a, "kind": kind,
            "more": more}


def example(rng, split, kind=None, max_docs=6, extra=0, hard=False):
    """One example of `kind` (drawn when None: single and twohop most often), with `extra`
    more single-hop questions on its documents in "more" (question, answer); hard: see
    question()."""
    if kind is None:
        kind = rng.choices(KINDS, weights=(4, 3, 2, 1))[0]
    return question(World(rng, split), kind, max_docs, extra, hard)


class Corpus:
    """A fixed world for benchmarks: people employed by its companies, one fixed document per
    entity stating all its facts. Questions over it draw their documents from the same pool, so
    the same documents recur across requests in other orders and under other system prompts,
    as they do in a RAG application."""

    def __init__(self, seed, split="heldout", n_companies=40, n_people=80):
        self.rng = r = random.Random("corpus-%s-%d" % (split, seed))
        w = World(r, split)
        self.split = split
        self.companies = [company_facts(w, w.company()) for _ in range(n_companies)]
        self.people = [person_facts(w, w.person(), r.choice(self.companies))
                       for _ in range(n_people)]
        self.docs = {}
        for e in self.companies + self.people:
            self.docs[e["name"]] = document(w, e, list(e["facts"]))[0]
        self.by_name = {e["name"]: e for e in self.companies + self.people}

    def ask(self, kind):
        """One example of `kind` whose 4-6 documents come from the pool."""
        r, split = self.rng, self.split
        need = []
        if kind == "single":
            e = r.choice(self.people + self.people + self.companies)
            fact = r.choice([k[2] for k in QUESTIONS if k[0] == "single" and
                             k[1] == e["type"]])
            need = [e]
            q = pick(r, QUESTIONS[("single", e["type"], fact)], split)[0].format(a=e["name"])
            a = e["facts"][fact]
        elif kind == "twohop":
            fact = r.choice(("city", "product"))
            p = r.choice(self.people)
            c = self.by_name[p["facts"]["employer"]]
            need = [p, c]
            q = pick(r, QUESTIONS[("twohop", "person", fact)], split)[0].format(a=p["name"])
            a = "%s, %s" % (c["name"], c["facts"][fact])
        elif kind == "compare":
            pool, fact = r.choice(((self.people, "age"), (self.companies, "founded")))
            x, y = r.sample(pool, 2)
            while x["facts"][fact] == y["facts"][fact]:
                x, y = r.sample(pool, 2)
            need = [x, y]
            q = pick(r, QUESTIONS[("compare", x["type"], fact)], split)[0].format(
                a=x["name"], b=y["name"])
            vx, vy = int(x["facts"][fact]), int(y["facts"][fact])
            older = x if (vx > vy if fact == "age" else vx < vy) else y
            a = "%d vs %d: %s" % (vx, vy, older["name"])
        else:
            e = r.choice(self.people + self.people + self.companies)
            fact = r.choice([k[2] for k in QUESTIONS if k[0] == "single" and
                             k[1] == e["type"]])
            q = pick(r, QUESTIONS[("single", e["type"], fact)], split)[0].format(a=e["name"])
            a = "unknown"
            absent = e
        names = [e["name"] for e in need]
        others = [n for n in self.docs if n not in names and
                  (kind != "unknown" or n != absent["name"])]
        # a distractor must not answer the question too: nobody else's document names the
        # entity asked about (a person's document names the employer)
        asked = names[0] if names else absent["name"]
        others = [n for n in others if asked not in self.docs[n]]
        names += r.sample(others, r.randint(4, 6) - len(names))
        r.shuffle(names)
        return {"system": pick(r, SYSTEMS, split)[0], "documents": [self.docs[n] for n in names],
                "question": q, "answer": a, "kind": kind}


def binding_example(rng, split, extra=0):
    """A short drill in finding the entity asked about (the training's binding stage): 3-8
    one-sentence documents that each state the same fact for another entity of one type, half
    of the names sharing a part with another's, and questions about some of them. Reading the
    fact alone answers one in 3-8; only the whole name answers them all."""
    w = World(rng, split)
    etype = rng.choice(("person", "person", "company"))
    fact = rng.choice([k[2] for k in QUESTIONS if k[0] == "single" and k[1] == etype])
    ents = [with_facts(w, w.entity(etype))]
    for _ in range(rng.randint(2, 7)):
        e = w.namesake(rng.choice(ents)) if rng.random() < 0.5 else None
        ents.append(with_facts(w, e or w.entity(etype)))
    rows = PERSON_SENT if etype == "person" else COMPANY_SENT
    docs = []
    for e in ents:
        tmpl = pick(rng, [row[1:] for row in rows if row[0] == fact], split)[0]
        s = fact_sentence(tmpl, e, fact, e["name"])
        docs.append(s[0].upper() + s[1:])
    rng.shuffle(docs)
    asked = [ents[rng.randrange(len(ents))] for _ in range(1 + extra)]
    qa = [(pick(rng, QUESTIONS[("single", etype, fact)], split)[0].format(a=e["name"]),
           e["facts"][fact]) for e in asked]
    return {"system": pick(rng, SYSTEMS, split)[0], "documents": docs,
            "question": qa[0][0], "answer": qa[0][1], "kind": "single", "more": qa[1:]}


def segments(ex):
    """The segments the gateway sends the worker for this example as a chat request with
    `documents` under CHAT_TEMPLATE: system segment, chunks, question segment (DESIGN §3)."""
    return (["<|im_start|>system\n" + ex["system"]] + list(ex["documents"]) +
            ["<|im_end|>\n<|im_start|>user\n" + ex["question"] +
             "<|im_end|>\n<|im_start|>assistant\n"])


def eval_set(seed, n_per_kind):
    """The held-out evaluation questions: n_per_kind of each kind, from the held-out split."""
    rng = random.Random("heldout-%d" % seed)
    return [example(rng, "heldout", k) for k in KINDS for _ in range(n_per_kind)]


if __name__ == "__main__":
    rng = random.Random(1)
    for k in KINDS:
        ex = example(rng, "heldout", k)
        print(SEPARATOR.join(segments(ex)).replace("\n", "\\n"), "=>", ex["answer"])
