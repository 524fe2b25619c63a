"""Regenerate prompts.txt: templated instructions written for this project (MIT, like the project).

    python mtp_cli/train/prompts/build_prompts.py > mtp_cli/train/prompts/prompts.txt

Deterministic: every (template, subject) pair of each kind, shuffled with a fixed seed.
"""

from __future__ import annotations

import random

KINDS: dict[str, tuple[list[str], list[str]]] = {
    "email": ([
        "Write a short email to {s}.",
        "Draft a polite email {s}.",
    ], [
        "my landlord about a broken heater", "a colleague asking to move our meeting to Friday",
        "my team announcing a new project", "a customer apologising for a late delivery",
        "a professor asking for an extension on my essay", "my neighbour about their barking dog",
        "a hotel asking about early check-in", "my manager requesting a day off",
        "a friend inviting them to a birthday party", "a company declining their job offer",
        "the school about my child's absence", "a supplier asking for a price quote",
    ]),
    "recipe": ([
        "Give me a simple recipe for {s}.",
        "How do I cook {s}?",
        "List the ingredients and steps for {s}.",
    ], [
        "pancakes", "tomato soup", "chocolate chip cookies", "a vegetable stir fry", "banana bread",
        "guacamole", "spaghetti carbonara", "a green salad", "scrambled eggs", "lentil curry",
        "homemade pizza", "a fruit smoothie", "roast chicken", "fried rice",
    ]),
    "story": ([
        "Write a short story about {s}.",
        "Tell me a bedtime story about {s}.",
        "Write the opening paragraph of a story about {s}.",
    ], [
        "a dragon who is afraid of fire", "a robot learning to paint", "a lost cat finding its way home",
        "two friends on a camping trip", "a lighthouse keeper", "a girl who can talk to trees",
        "a detective solving a mystery in a small town", "a spaceship crew discovering a new planet",
        "an old man and his garden", "a magical bakery", "a boy who finds a map in the attic",
        "a city where it never stops raining",
    ]),
    "howto": ([
        "How do I {s}?",
        "Explain step by step how to {s}.",
        "What is the best way to {s}?",
    ], [
        "change a flat tyre", "start running as a beginner", "learn a new language", "save money each month",
        "plant tomatoes", "write a good CV", "prepare for a job interview", "clean a laptop keyboard",
        "make a budget", "improve my sleep", "set up a fish tank", "study for an exam",
        "back up my phone", "train a puppy", "reduce stress at work", "organise a small wedding",
    ]),
    "explain": ([
        "Explain {s} in simple terms.",
        "What is {s}?",
        "Why is {s} important?",
        "Explain {s} to a ten-year-old.",
    ], [
        "photosynthesis", "gravity", "the water cycle", "inflation", "climate change", "the internet",
        "democracy", "vaccines", "black holes", "the immune system", "electricity", "recycling",
        "the stock market", "machine learning", "evolution", "the moon's phases", "sleep",
        "the French Revolution", "volcanoes", "a balanced diet",
    ]),
    "list": ([
        "List five {s}.",
        "Give me ten {s}.",
        "What are some {s}?",
    ], [
        "tips for staying healthy", "animals that live in the ocean", "ideas for a rainy day",
        "books every teenager should read", "ways to be more productive", "fruits rich in vitamin C",
        "famous scientists", "things to pack for a beach holiday", "hobbies you can do at home",
        "countries in South America", "ways to save energy at home", "questions to ask in an interview",
        "easy vegetables to grow", "fun facts about space",
    ]),
    "poem": ([
        "Write a short poem about {s}.",
        "Write a haiku about {s}.",
    ], [
        "the sea", "autumn leaves", "friendship", "a city at night", "the first snow", "a cup of coffee",
        "the moon", "growing old", "a summer storm", "mountains",
    ]),
    "compare": ([
        "What is the difference between {s}?",
        "Compare {s}.",
    ], [
        "a virus and a bacterium", "weather and climate", "cats and dogs as pets", "tea and coffee",
        "renting and buying a house", "a lake and a sea", "speed and velocity", "Python and JavaScript",
        "a crocodile and an alligator", "saving and investing",
    ]),
    "advice": ([
        "Give me advice on {s}.",
        "I need help with {s}. What should I do?",
    ], [
        "making new friends in a new city", "talking to my boss about a raise", "choosing a laptop",
        "keeping a houseplant alive", "staying motivated", "learning to cook", "planning a road trip",
        "dealing with a difficult coworker", "getting better at public speaking", "writing a thank-you note",
    ]),
    "summary": ([
        "Summarize {s} in a few sentences.",
        "Give me a short summary of {s}.",
    ], [
        "the plot of Romeo and Juliet", "the story of Cinderella", "the history of the bicycle",
        "how the Roman Empire fell", "the life of Marie Curie", "the plot of The Lord of the Rings",
        "the first moon landing", "the invention of the printing press",
    ]),
    "describe": ([
        "Describe {s}.",
        "Write a product description for {s}.",
    ], [
        "a sunny morning at the beach", "a busy market", "a pair of running shoes", "a reusable water bottle",
        "your ideal house", "a forest in winter", "a cosy cafe", "a smartwatch",
    ]),
    "trivia": ([
        "{s}",
    ], [
        "What is the capital of France?", "Who wrote Hamlet?", "How many legs does a spider have?",
        "What is the largest planet in our solar system?", "Why is the sky blue?",
        "How far is the moon from the Earth?", "What is 17 times 23?", "Who painted the Mona Lisa?",
        "What is the boiling point of water?", "How many continents are there?",
        "What language is spoken in Brazil?", "What do bees make?", "How does a rainbow form?",
        "What is the tallest mountain in the world?", "Why do leaves change colour in autumn?",
    ]),
    "code": ([
        "Write a Python function that {s}.",
    ], [
        "reverses a string", "checks whether a number is prime", "returns the largest item in a list",
        "counts the vowels in a sentence", "computes the factorial of a number", "sorts a list of names",
    ]),
}


def prompts() -> list[str]:
    out = [t.format(s=s) for templates, subjects in KINDS.values() for t in templates for s in subjects]
    random.Random(20240611).shuffle(out)
    return out


if __name__ == "__main__":
    for p in prompts():
        print(p)
