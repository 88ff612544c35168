"""Word lists of the long-context suite (``tasks.long_data``), written for headwise: the generated haystack's
vocabulary, the needles' keys and word values, the aggregation lists and the people and cities of the facts.
Plain common English words and invented names; no licence beyond the project's applies."""

NOUNS = tuple("""
anchor apple arrow badge bakery balcony ballad banner barrel basket beacon bell bench blanket boat bottle bracelet
bridge bucket cabin cable camera canal candle canvas carpet castle cellar chapel chimney circle cliff clock cloud
coast compass copper cottage county crystal curtain cushion desert diamond dock doorway dragon drum engine falcon
feather fence ferry festival fiddle field forest fountain garden garlic gate glacier globe granite guitar hammer
harbor harvest helmet hill hinge horizon island jacket jungle kettle kingdom ladder lake lantern lemon library
lighthouse meadow melody mill mirror monument mountain museum needle nest oasis orchard oven paddle palace parcel
pasture pebble pencil pepper piano pillar pilot planet pocket pond portrait potato pottery puzzle quarry quilt
rabbit radio railway raven ribbon river rocket saddle sail satchel scarf school shelter shovel signal silver
spoon stable statue stream studio summit sunset tablet teapot temple theater thimble thunder ticket tower tractor
trumpet tunnel turtle umbrella valley vessel village violin wagon walnut whistle willow window workshop yard
""".split())

ADJECTIVES = tuple("""
ancient bitter bold brave breezy bright brisk calm careful cheerful chilly clever cloudy colorful crisp curious
daring dusty eager early elegant faint famous fancy fearless fierce flat fragrant friendly frosty gentle giant
glossy golden graceful grand hidden hollow honest humble icy jolly keen kind lively lonely loud lucky lunar
marble merry mighty misty modest narrow neat nimble noble odd orange patient plain playful polite proud quick
quiet rapid rare rocky rosy rough round royal rusty sandy scarlet secret shiny silent simple sleepy slender
smooth snowy soft solid spare speedy spicy steady sticky stormy strange sturdy sunny swift tall tender thin
tidy tiny tranquil vivid warm wild windy wise wooden young
""".split())

VERBS = tuple("""
admired built carried cleaned collected crossed delivered described designed discovered drew explored fixed
followed gathered guarded hid inspected joined kept lifted measured mended moved noticed opened packed painted
planted polished prepared protected raised repaired rescued restored sailed searched shared signed sketched
sorted studied tested tracked traded visited watched weighed welcomed wrapped
""".split())

PEOPLE = tuple("""
baker builder captain carpenter clerk cook dancer doctor driver farmer fisher gardener guide hunter inventor
janitor judge keeper librarian mason merchant miner nurse painter pilot poet potter sailor scholar scribe singer
smith tailor teacher trader traveler weaver writer
""".split())

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")

FIRST_NAMES = tuple("""
Adela Bertram Calla Dorian Elsbeth Fenwick Gisela Hollis Ingrid Jasper Katrin Leopold Marisol Nadim Odette
Percival Quilla Rosalind Severin Thea Ulric Vesna Wendell Xenia Yorick Zelda Anselm Brigida Caspian Delphine
Eamon Florian Greta Hamish Isolde Jorah Kaspar Linnea Magnus Nerissa Osric Petra Rainer Sabine Tobias Ursula
Valerian Wilhelmina
""".split())

LAST_NAMES = tuple("""
Abernathy Blackwood Castellan Draycott Ellsworth Fairbrook Greystone Hawthorne Ingleby Jessup Kettleby Larkspur
Merriweather Northcott Oakhurst Pemberton Quimby Rothwell Stanhope Thistlewood Underhill Vantassel Whitcombe
Yardley Ashdown Brackenridge Cobbledick Dunmore Everhart Foxworth Goodfellow Hollingsworth Ironside Kingsley
Lockhart Mortimer Netherby Ormsby Pickering Ravenscroft Sutherland Tolliver Upshaw Wetherby
""".split())

CITIES = tuple("""
Aberdeen Antwerp Bergen Bologna Bordeaux Bruges Cadiz Calgary Cardiff Cork Dresden Dublin Durban Galway Geneva
Genoa Glasgow Granada Graz Hamburg Helsinki Innsbruck Kyoto Leipzig Lima Lisbon Lyon Malmo Marseille Montreal
Munich Nairobi Naples Oslo Porto Prague Quebec Riga Rotterdam Salzburg Seville Tallinn Toledo Toronto Turin
Utrecht Valencia Verona Vienna Vilnius Warsaw Zurich
""".split())
