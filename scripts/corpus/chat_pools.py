"""Slot values, system prompts and tool-free chat for scripts/corpus/gen_chat.py.

SLOTS maps a tool parameter name to a function (random.Random, args so far) -> value; the
generator fills a request's slots in the tool's parameter order, so a slot may depend on an
earlier one (to_unit on from_unit). plain_chat / no_tool_request give user/assistant turns that
need no tool. Pure data; no I/O.
"""

CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Denver", "Austin", "Berlin", "Madrid", "Rome", "Seoul",
          "Mumbai", "Nairobi", "Toronto", "Sydney", "Dublin", "Prague", "Vienna", "Hanoi", "Boston", "Chicago",
          "Helsinki", "Lisbon", "Athens", "Bogota", "Manila", "Quito", "Zurich", "Warsaw", "Kyoto", "Perth", "Porto",
          "Glasgow", "Seattle", "Havana", "Dakar", "Tunis", "Riga", "Tallinn", "Osaka", "Munich", "Lyon", "Naples",
          "Accra", "Santiago", "Montreal", "Auckland", "Bergen", "Krakow"]
FIRST = ["Ana", "Bo", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Mateo", "Nia",
         "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Vera", "Wen", "Yuki", "Zoe", "Lucas", "Maya", "Noah"]
DOMAINS = ["example.com", "mail.org", "work.net", "uni.edu", "home.io"]
DIRS = ["notes", "docs", "src", "data", "reports", "todo", "tmp", "projects/alpha", "archive", "letters"]
FILES = ["todo.txt", "plan.md", "report.csv", "config.toml", "hello.txt", "ideas.md", "budget.csv", "log.txt",
         "readme.md", "draft.txt", "list.txt", "main.py"]
WORDS = ["serendipity", "ephemeral", "ubiquitous", "laconic", "quixotic", "gregarious", "meticulous", "pragmatic",
         "resilient", "candid", "verbose", "frugal", "lucid", "obscure", "tenacious", "zealous", "benign", "sparse"]
TOPICS = ["climate", "football", "space exploration", "electric cars", "elections", "the economy", "open source",
          "artificial intelligence", "tennis", "health", "music festivals", "science", "the stock market", "movies"]
QUERIES = ["sourdough bread recipes", "how to fix a flat tire", "best hiking trails", "history of the printing press",
           "python list comprehension", "cheap flights tips", "how volcanoes form", "learning the guitar",
           "ocean tides", "vegan lasagna", "linux file permissions", "origami cranes", "solar panels at home"]
SONGS = ["some jazz", "Beethoven's fifth", "lo-fi beats", "the Beatles", "classic rock", "Miles Davis", "reggae",
         "my workout playlist", "piano music", "Bach cello suites", "country music", "Daft Punk"]
TASKS = ["call mom", "water the plants", "buy milk", "take my medicine", "submit the report", "walk the dog",
         "pay the rent", "book a haircut", "email the landlord", "pick up the kids", "stretch", "check the oven"]
PHRASES = ["good morning", "where is the train station", "thank you very much", "I love this city", "how much is it",
           "see you tomorrow", "the meeting is at noon", "happy birthday", "I am hungry", "where is the library"]
LANGS = ["French", "Spanish", "German", "Japanese", "Italian", "Portuguese", "Korean", "Swahili", "Dutch", "Polish"]
UNITS = [["kilometers", "miles", "meters", "feet"], ["kilograms", "pounds", "grams", "ounces"],
         ["liters", "gallons", "milliliters", "cups"], ["celsius", "fahrenheit", "kelvin"]]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR", "BRL", "SEK", "NOK", "MXN"]
SUBJECTS = ["Lunch on Friday", "Project update", "Invoice", "Weekend plans", "Quick question", "Meeting notes",
            "Travel dates", "Thanks"]
BODIES = ["I'll be ten minutes late", "the draft is ready for review", "can we move our call to Monday",
          "thanks for your help yesterday", "the invoice is attached", "let's meet at the cafe at noon"]
MESSAGES = ["running late", "on my way", "see you at 7", "call me when you can", "dinner is ready",
            "happy birthday!", "I got the tickets", "don't forget the keys"]
EVENTS = ["Team sync", "Dentist", "Yoga class", "Project review", "Lunch with Sam", "Budget meeting", "Piano lesson",
          "Flight to Oslo", "Book club", "Parent meeting"]
CUISINES = ["Italian", "Thai", "Mexican", "Japanese", "Indian", "Ethiopian", "Greek", "vegan", "Korean", "French"]
ROOMS = ["kitchen", "bedroom", "living room", "office", "hallway", "garage", "bathroom"]
LABELS = ["pasta", "tea", "laundry", "break", "oven", "workout", "eggs"]


def _expr(r):
    a, b, c = r.randint(2, 999), r.randint(2, 99), r.randint(1, 20)
    return r.choice([f"{a}+{b}", f"{a}*{b}", f"{a}-{b}", f"({a}+{b})*{c}", f"{a}/{c}", f"{a}*{b}-{c}"])


def _date(r):
    return f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"


def _to_unit(r, args):
    group = next((g for g in UNITS if args.get("from_unit") in g), UNITS[0])
    return r.choice([u for u in group if u != args.get("from_unit")])


def _to_currency(r, args):
    return r.choice([c for c in CURRENCIES if c != args.get("from_currency")])


SLOTS = {
    "city": lambda r, a: r.choice(CITIES),
    "origin": lambda r, a: r.choice(CITIES),
    "destination": lambda r, a: r.choice([c for c in CITIES if c != a.get("origin")]),
    "unit": lambda r, a: r.choice(["celsius", "fahrenheit"]),
    "days": lambda r, a: r.randint(2, 7),
    "path": lambda r, a: f"{r.choice(DIRS)}/{r.choice(FILES)}" if r.random() < 0.8 else r.choice(DIRS),
    "content": lambda r, a: r.choice(PHRASES + MESSAGES + TASKS),
    "query": lambda r, a: r.choice(QUERIES),
    "song": lambda r, a: r.choice(SONGS),
    "expression": lambda r, a: _expr(r),
    "title": lambda r, a: r.choice(EVENTS),
    "date": lambda r, a: _date(r),
    "time": lambda r, a: f"{r.randint(6, 21):02d}:{r.choice(['00', '15', '30', '45'])}",
    "to": lambda r, a: f"{r.choice(FIRST).lower()}@{r.choice(DOMAINS)}",
    "subject": lambda r, a: r.choice(SUBJECTS),
    "body": lambda r, a: r.choice(BODIES),
    "contact": lambda r, a: r.choice(FIRST),
    "message": lambda r, a: r.choice(MESSAGES),
    "name": lambda r, a: r.choice(FIRST) + " " + r.choice(["Smith", "Okafor", "Tanaka", "Garcia", "Novak", "Ali"]),
    "value": lambda r, a: r.choice([r.randint(1, 500), round(r.uniform(0.5, 100), 1)]),
    "from_unit": lambda r, a: r.choice(r.choice(UNITS)),
    "to_unit": _to_unit,
    "symbol": lambda r, a: "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(r.randint(2, 4))),
    "text": lambda r, a: r.choice(PHRASES),
    "target_language": lambda r, a: r.choice(LANGS),
    "minutes": lambda r, a: r.choice([1, 2, 3, 5, 10, 12, 15, 20, 25, 30, 45, 60, 90]),
    "label": lambda r, a: r.choice(LABELS),
    "amount": lambda r, a: r.choice([r.randint(1, 5000), round(r.uniform(1, 500), 2)]),
    "from_currency": lambda r, a: r.choice(CURRENCIES),
    "to_currency": _to_currency,
    "topic": lambda r, a: r.choice(TOPICS),
    "task": lambda r, a: r.choice(TASKS),
    "word": lambda r, a: r.choice(WORDS),
    "cuisine": lambda r, a: r.choice(CUISINES),
    "tracking_number": lambda r, a: r.choice(["1Z", "TRK", "PKG", "JD"]) + str(r.randint(10 ** 7, 10 ** 9)),
    "room": lambda r, a: r.choice(ROOMS),
    "state": lambda r, a: r.choice(["on", "off"]),
}

SYSTEM_PROMPTS = ["", "", "You are a helpful assistant.", "You are Fathom, a concise assistant that uses tools when useful.",
                  "You are a friendly assistant. Keep answers short.", "Answer briefly. Use a tool when one fits the request.",
                  "You are an assistant running on a small local model."]
PREFIXES = ["Hey, ", "Hi! ", "Please, ", "Quick one: ", "Hello, ", "Excuse me, ", "Okay, "]
SUFFIXES = [" Thanks!", " Thank you.", " Please.", " Cheers.", " Asap.", " :)"]


def decorate(text, r):
    """A request with the greeting (30%) or thanks (20%) people add around it."""
    if r.random() < 0.3:
        keep = text.startswith(("I ", "I'")) or text[1:2].isupper()
        text = r.choice(PREFIXES) + (text if keep else text[0].lower() + text[1:])
    if r.random() < 0.2:
        text += r.choice(SUFFIXES)
    return text

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
            "Egypt": "Cairo", "Germany": "Berlin", "Spain": "Madrid", "Italy": "Rome", "Canada": "Ottawa",
            "Australia": "Canberra", "Ireland": "Dublin", "Austria": "Vienna", "Vietnam": "Hanoi",
            "Finland": "Helsinki", "Portugal": "Lisbon", "Greece": "Athens", "Chile": "Santiago", "Poland": "Warsaw",
            "Ghana": "Accra", "Cuba": "Havana", "Senegal": "Dakar", "Latvia": "Riga", "Estonia": "Tallinn"}
OPPOSITES = {"hot": "cold", "big": "small", "up": "down", "fast": "slow", "early": "late", "happy": "sad",
             "light": "dark", "open": "closed", "old": "new", "full": "empty", "strong": "weak", "high": "low"}
COLOURS = {"the sky": "blue", "grass": "green", "snow": "white", "a banana": "yellow", "coal": "black",
           "a tomato": "red", "an orange": "orange", "a plum": "purple"}
SOUNDS = {"dog": "barks", "cat": "meows", "cow": "moos", "duck": "quacks", "lion": "roars", "owl": "hoots",
          "sheep": "bleats", "horse": "neighs"}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
SPELL = WORDS + ["garden", "window", "planet", "orange", "rocket", "silver", "bridge", "coffee", "forest", "yellow"]


def _qa(r):
    k = r.randrange(10)
    if k == 0:
        c = r.choice(sorted(CAPITALS))
        return r.choice([f"What is the capital of {c}?", f"capital of {c}?", f"Which city is the capital of {c}?"]), \
            f"The capital of {c} is {CAPITALS[c]}."
    if k == 1:
        w = r.choice(sorted(OPPOSITES))
        return f"What is the opposite of {w}?", f"The opposite of \"{w}\" is \"{OPPOSITES[w]}\"."
    if k == 2:
        t = r.choice(sorted(COLOURS))
        return f"What colour is {t}?", f"{t[0].upper() + t[1:]} is usually {COLOURS[t]}."
    if k == 3:
        a = r.choice(sorted(SOUNDS))
        return f"What sound does a {a} make?", f"A {a} {SOUNDS[a]}."
    if k == 4:
        w = r.choice(SPELL)
        return f"How do you spell {w}?", f"{w} is spelled {'-'.join(w.upper())}."
    if k == 5:
        w = r.choice(SPELL)
        return f"How many letters are in the word {w}?", f"\"{w}\" has {len(w)} letters."
    if k == 6:
        d = r.randrange(7)
        return f"What day comes after {DAYS[d]}?", f"{DAYS[(d + 1) % 7]} comes after {DAYS[d]}."
    if k == 7:
        n = r.randint(1, 999)
        return f"What number comes after {n}?", f"{n + 1} comes after {n}."
    if k == 8:
        return r.choice(["Who are you?", "What are you?", "Are you a bot?"]), \
            "I'm Fathom, a small assistant model. I can chat and call the tools I'm given."
    return r.choice(["Tell me a joke.", "Make me laugh.", "Know any jokes?"]), r.choice([
        "Why did the computer go to the doctor? It had a virus.",
        "I told my plants a joke. They didn't laugh, but they grew on me.",
        "Why do programmers prefer dark mode? Because light attracts bugs."])


def _greeting(r):
    return r.choice(["Hi", "Hello", "Hey there", "Good morning", "Good evening", "Hi!", "hello"]), r.choice([
        "Hello! How can I help you today?", "Hi! What can I do for you?", "Hey! How can I help?"])


def _thanks(r):
    return r.choice(["Thanks!", "Thank you", "thx", "Great, thanks a lot."]), r.choice([
        "You're welcome!", "Happy to help!", "Anytime."])


def _turn(r):
    u = r.random()
    q, a = _greeting(r) if u < 0.2 else _thanks(r) if u < 0.3 else _qa(r)
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def plain_chat(r):
    msgs = []
    for _ in range(r.choice([1, 1, 2, 3])):
        msgs += _turn(r)
    return msgs


def no_tool_request(r):
    q, a = _qa(r)
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
